package nginx

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"heft/gateway/target"
)

// refuseFor is how long a worker whose line the check refused stays left
// out before it is tried again (its name may resolve by then). Meanwhile
// every apply writes and checks only the rest, so the refused worker costs
// one failed check per refuseFor rather than one per sync.
const refuseFor = time.Minute

type refusal struct {
	at  time.Time
	why string
}

// leaveOutRefused drops from m the workers whose line was refused less
// than refuseFor ago, adding each to dropped.
func (n *Nginx) leaveOutRefused(m target.Model, dropped []string) (target.Model, []string) {
	now := n.now()
	for addr, r := range n.refused {
		if now.Sub(r.at) >= refuseFor {
			delete(n.refused, addr)
		}
	}
	out := target.Model{Name: m.Name}
	for _, b := range m.Backends {
		if r, ok := n.refused[b.Address]; ok {
			dropped = append(dropped, fmt.Sprintf("worker %s left out: the check refused its line %s ago (%s); tried again after %s",
				target.Printable(b.WorkerID), now.Sub(r.at).Round(time.Second), r.why, refuseFor))
			continue
		}
		out.Backends = append(out.Backends, b)
	}
	return out, dropped
}

// refusedBackend finds the worker whose line of data the check's message
// names: nginx says "... in FILE:LINE"; a message naming no file (a check
// command of the operator's own) is matched by the host nginx could not
// resolve, `host not found in upstream "HOST:PORT"`.
func refusedBackend(msg, file string, data []byte, m target.Model) (target.Backend, bool) {
	byAddr := map[string]target.Backend{}
	for _, b := range m.Backends {
		byAddr[b.Address] = b
	}
	if at := regexp.MustCompile(regexp.QuoteMeta(file) + `:([0-9]+)`).FindStringSubmatch(msg); at != nil {
		n, _ := strconv.Atoi(at[1])
		lines := bytes.Split(data, []byte("\n"))
		if n >= 1 && n <= len(lines) {
			if f := strings.Fields(string(lines[n-1])); len(f) >= 2 && f[0] == "server" {
				b, ok := byAddr[strings.TrimSuffix(f[1], ";")]
				return b, ok
			}
		}
		return target.Backend{}, false
	}
	if inFile.MatchString(msg) {
		return target.Backend{}, false // another file's line: not a worker's
	}
	if q := hostNotFound.FindStringSubmatch(msg); q != nil {
		b, ok := byAddr[q[1]]
		return b, ok
	}
	return target.Backend{}, false
}

var (
	hostNotFound = regexp.MustCompile(`host not found in upstream "([^"]+)"`)
	inFile       = regexp.MustCompile(` in \S+:[0-9]+`)
)

// without returns m less the worker at addr.
func without(m target.Model, addr string) target.Model {
	out := target.Model{Name: m.Name}
	for _, b := range m.Backends {
		if b.Address != addr {
			out.Backends = append(out.Backends, b)
		}
	}
	return out
}

// servedUnresolved reports whether the check refused b's line because
// nginx could not resolve its name while the last good file, old, has
// nginx serve b and the coordinator still serves it: nginx resolved it at
// its last load and serves it still, so the name failing now is the nginx
// host's DNS, not the worker. A worker to be drained (held, offline) is
// not: leaving it out drains it, and a retired host whose DNS record was
// deleted must not freeze the upstream until the coordinator forgets it.
func servedUnresolved(msg string, old []byte, upstream string, b target.Backend) bool {
	if old == nil || !b.Serving || !hostNotFound.MatchString(msg) {
		return false
	}
	served, err := upstreamServers(string(old), upstream)
	if err != nil {
		return false // not heft's file as it writes it: the one-bad-worker rule, as before
	}
	for _, s := range served {
		if strings.EqualFold(s.Address, b.Address) {
			return true
		}
	}
	return false
}

// keepUnresolvedFor is how long a served worker whose name does not
// resolve keeps the last good file before it is left out like any refused
// worker. nginx cannot tell an outage from a deleted record ("host not
// found" either way), and while the file is kept nothing changes in this
// upstream, nor in another model's on the same nginx (nginx -t reads
// every file, this one's unresolvable line included): an outage shorter
// than this costs no worker, and a name that stays gone (a retired host
// still listed stale for hours) stops holding every change after it.
const keepUnresolvedFor = 5 * time.Minute

// holdUnresolved reports whether the served worker at addr, whose name
// the check could not resolve, still keeps the last good file: for
// keepUnresolvedFor after its name first failed since the last check
// that passed.
func (n *Nginx) holdUnresolved(addr string) bool {
	now := n.now()
	since, seen := n.unresolved[addr]
	if !seen {
		n.unresolved[addr] = now
		return true
	}
	return now.Sub(since) < keepUnresolvedFor
}

// keepUnresolved puts the last good file back, with no reload, for a
// served worker whose name does not resolve now. Leaving it out (the
// one-bad-worker rule) would have the reload take a healthy worker out of
// nginx and its traffic onto the rest, for the length of a DNS outage
// that nginx rides out by itself. Nothing is remembered: the next sync
// checks again, and applies once the name resolves. The message stays the
// same through an outage, so the syncer logs it once.
func (n *Nginx) keepUnresolved(old []byte, b target.Backend) error {
	err := target.Failf(target.ReasonResolve, "worker %s: nginx cannot resolve %s now, and serves it from its last load; the last good %s stays and nginx was not reloaded, so that it keeps serving every worker (tried again at the next sync; left out if it still does not resolve %v after it first failed)",
		target.Printable(b.WorkerID), target.Printable(b.Address), n.cfg.File, keepUnresolvedFor)
	if rerr := n.restore(old); rerr != nil {
		return errors.Join(err, target.Failf(target.ReasonWrite, "and putting back the last good file failed: %v", rerr))
	}
	return err
}
