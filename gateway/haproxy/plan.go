package haproxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"heft/gateway/render"
	"heft/gateway/scale"
	"heft/gateway/target"
)

// maxWeight is the largest weight HAProxy's runtime API accepts.
const maxWeight = render.HAProxyMaxWeight

// want is a backend with its resolved address and its weight in HAProxy's
// range. Addr is the zero AddrPort when the address never resolved
// (target.Resolved).
type want struct {
	target.Backend
	Addr netip.AddrPort
	Prev netip.AddrPort // its address before its DNS answer changed (target.Resolved)
	Int  int
}

// plan is what it takes to bring a backend's servers to the wanted state.
type plan struct {
	cmds     []string // in the order to send them
	soft     []string // commands that may fail without harm (del server)
	problems []error
	rounding float64
	serving  int
}

// planOptions is the part of Config the planner reads.
type planOptions struct {
	Backend    string
	Slots      string // server-template prefix: heft's own servers
	ByWeight   bool   // slots hold the serving workers heaviest first
	AddServers bool
	MaxConn    bool
}

func (o planOptions) isSlot(name string) bool {
	rest, ok := strings.CutPrefix(name, o.Slots)
	if !ok || rest == "" {
		return false
	}
	for _, r := range rest {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// isAdded reports whether heft-sync added the server with "add server".
func (o planOptions) isAdded(name string) bool { return strings.HasPrefix(name, o.Slots+"-") }

func (o planOptions) addedName(a netip.AddrPort) string {
	return fmt.Sprintf("%s-%s-%d", o.Slots, a.Addr(), a.Port())
}

// scaleWeights gives every serving backend its weight in 1..256.
func scaleWeights(ws []want) float64 {
	var fs []float64
	var idx []int
	for i, w := range ws {
		if w.Serving {
			fs = append(fs, w.Weight)
			idx = append(idx, i)
		}
	}
	ints, rounding := scale.Ints(fs, maxWeight)
	for j, i := range idx {
		ws[i].Int = ints[j]
	}
	return rounding
}

// makePlan compares the servers HAProxy lists with the wanted backends.
//
// Which server carries which worker:
//   - by address (the default): a server whose address is a worker's
//     carries it, whether listed in the file or a slot; a worker whose DNS
//     answer changed keeps the slot at its old address (a serving one, or
//     any while a name is unresolved); a serving worker
//     still without one goes into a free slot (a slot no worker's address
//     holds), or, with AddServers, into a server added for it. A worker
//     that is not serving and has no server needs none.
//   - by weight: the slots, in server ID order, carry the serving workers
//     heaviest first, re-addressed as the order changes, so that "balance
//     first" fills the fastest worker first. Servers listed in the file are
//     left alone.
//
// Servers that carry no worker: free slots go to maintenance, servers heft
// added are put in maintenance and deleted, and every other server (one
// heft does not know) is left as it is.
//
// A serving worker whose address never resolved could be on any of heft's
// servers, and a failed lookup is no evidence against its engine: then
// heft's servers that no resolved worker claims and that are not in
// maintenance are left as they are (by weight, every slot is, since the
// order moves workers between slots).
//
// ws holds one want per IP:port (target.Resolver.ResolveAll).
func makePlan(servers []server, ws []want, o planOptions) plan {
	var p plan
	p.rounding = scaleWeights(ws)
	var resolved []want
	unresolved := false // a serving worker's server is unknown
	for _, w := range ws {
		if w.Addr.IsValid() {
			resolved = append(resolved, w)
		} else if w.Serving {
			unresolved = true
		}
	}
	ws = resolved
	var slots []int
	for i, s := range servers {
		if o.isSlot(s.Name) {
			slots = append(slots, i)
		}
	}
	slices.SortFunc(slots, func(a, b int) int { return cmp.Compare(servers[a].ID, servers[b].ID) })

	var assign map[int]*want
	if o.ByWeight && !unresolved {
		assign = p.assignByWeight(slots, ws, o)
	} else {
		// By weight too while a serving worker's server is unknown: the
		// weight order would move workers between slots, maybe off the
		// one that carries it, so each resolved worker keeps the server
		// at its address (a held one is drained there, weights change)
		// and only the servers no resolved worker is at stay as they are.
		assign = p.assignByAddress(servers, slots, ws, unresolved, o)
	}
	p.converge(servers, assign, o)
	return p
}

// leaveAsIs, assigned to a server, leaves it as it is: it may carry a
// serving worker whose address does not resolve now.
var leaveAsIs = &want{}

// assignByWeight gives the slots, in ID order, to the serving workers
// heaviest first; a worker past the last slot is a problem.
func (p *plan) assignByWeight(slots []int, ws []want, o planOptions) map[int]*want {
	assign := map[int]*want{} // server index → worker
	var serving []*want
	for i := range ws {
		if ws[i].Serving {
			serving = append(serving, &ws[i])
		}
	}
	slices.SortStableFunc(serving, func(a, b *want) int {
		if c := cmp.Compare(b.Weight, a.Weight); c != 0 {
			return c
		}
		return cmp.Compare(a.Address, b.Address)
	})
	for rank, w := range serving {
		if rank >= len(slots) {
			p.problems = append(p.problems, target.Failf(target.ReasonNoSlot,
				"worker %s (%s) has no slot: backend %s has %d %s slots for %d serving workers; add server-template slots",
				target.Printable(w.WorkerID), w.Address, o.Backend, len(slots), o.Slots, len(serving)))
			continue
		}
		assign[slots[rank]] = w
	}
	return assign
}

// assignByAddress gives each worker the servers at its address (one of
// heft's own per address), then a free slot to each serving worker still
// without one, or a server added for it (the commands go into p). With
// unresolved, heft's servers that no worker claims and that are not in
// maintenance are left as they are, and are not free.
func (p *plan) assignByAddress(servers []server, slots []int, ws []want, unresolved bool, o planOptions) map[int]*want {
	assign := map[int]*want{} // server index → worker
	byAddr := map[netip.AddrPort][]int{}
	for i, s := range servers {
		byAddr[s.Addr] = append(byAddr[s.Addr], i)
	}
	placed := map[netip.AddrPort]bool{}
	for i := range ws {
		w := &ws[i]
		inSlot := false
		for _, si := range byAddr[w.Addr] {
			own := o.isSlot(servers[si].Name) || o.isAdded(servers[si].Name)
			if own && inSlot {
				continue // a second slot at one address is freed
			}
			inSlot = inSlot || own
			assign[si] = w
			placed[w.Addr] = true
		}
	}
	// A worker whose DNS answer changed keeps the slot at its old address,
	// which no worker claims now: heft put it there. Else, with a name
	// unresolved, that slot was left as it is, and the worker, without a
	// free slot, stayed at its old address (a held one was not drained).
	// With every name resolved, a worker that does not serve needs no
	// server: its old slot is free for a serving worker, or goes to
	// maintenance, rather than stay drained at an address its engine left.
	// Nor does it take its old slot back out of maintenance when a name
	// is unresolved later: that slot carries nothing and stays free.
	for i := range ws {
		w := &ws[i]
		if placed[w.Addr] || !w.Prev.IsValid() || !w.Serving && !unresolved {
			continue
		}
		for _, si := range byAddr[w.Prev] {
			if assign[si] == nil && o.isSlot(servers[si].Name) && (w.Serving || !servers[si].maint()) {
				assign[si] = w
				placed[w.Addr] = true
				break
			}
		}
	}
	if unresolved {
		for i, s := range servers {
			if assign[i] == nil && !s.maint() && (o.isSlot(s.Name) || o.isAdded(s.Name)) {
				assign[i] = leaveAsIs
			}
		}
	}
	var free []int
	for _, si := range slots {
		if assign[si] == nil {
			free = append(free, si)
		}
	}
	for i := range ws {
		w := &ws[i]
		if !w.Serving || placed[w.Addr] {
			continue
		}
		switch {
		case len(free) > 0:
			assign[free[0]] = w
			free = free[1:]
		case o.AddServers:
			p.addServer(w, o)
		default:
			p.problems = append(p.problems, target.Failf(target.ReasonNoSlot,
				"worker %s (%s) has no server in backend %s: no server has its address and no %s slot is free; add server-template slots or set add_servers",
				target.Printable(w.WorkerID), w.Address, o.Backend, o.Slots))
		}
	}
	return assign
}

// addServer adds a server (HAProxy ≥ 2.5) for a serving worker, with
// the gateway's own health check as the backend defines it (its "option
// httpchk", else a connect check): an added server takes nothing from
// "default-server", and HAProxy starts its check only on "enable health".
// The check's timing is HAProxy's default (inter 2s, fall 3, rise 2).
func (p *plan) addServer(w *want, o planOptions) {
	ref := o.Backend + "/" + o.addedName(w.Addr)
	p.cmds = append(p.cmds, fmt.Sprintf("add server %s %s weight %d check", ref, w.Addr, w.Int))
	if o.MaxConn && w.MaxConcurrency > 0 {
		p.cmds = append(p.cmds, fmt.Sprintf("set maxconn server %s %d", ref, w.MaxConcurrency))
	}
	p.cmds = append(p.cmds, "enable health "+ref, "set server "+ref+" state ready")
	p.serving++
}

// converge adds the commands that bring each server to its worker's
// state: serving (address, weight, maxconn, ready), drained, or, for
// heft's servers that carry no worker, maintenance (and deletion of those
// it added). Servers heft does not know are left alone.
func (p *plan) converge(servers []server, assign map[int]*want, o planOptions) {
	var drains, maints []string
	for i, s := range servers {
		ref := o.Backend + "/" + s.Name
		w := assign[i]
		switch {
		case w == leaveAsIs:
			if !s.maint() && !s.drain() && s.Weight > 0 {
				p.serving++
			}
		case w == nil && o.isAdded(s.Name):
			if !s.maint() {
				maints = append(maints, "set server "+ref+" state maint")
			}
			p.soft = append(p.soft, "del server "+ref)
		case w == nil && o.isSlot(s.Name):
			if !s.maint() {
				maints = append(maints, "set server "+ref+" state maint")
			}
		case w == nil:
			// not heft's: left alone
		case w.Serving:
			p.serving++
			p.cmds = append(p.cmds, serve(s, ref, w, o)...)
		default:
			if s.maint() || !s.drain() {
				drains = append(drains, "set server "+ref+" state drain")
			}
		}
	}
	// Serving servers first, so a backend never passes through a moment
	// with fewer servers than it is about to have.
	p.cmds = append(append(p.cmds, drains...), maints...)
}

// serve returns the commands that make server s carry serving worker w.
func serve(s server, ref string, w *want, o planOptions) []string {
	var cmds []string
	if (o.isSlot(s.Name) || o.isAdded(s.Name)) && s.Addr != w.Addr {
		cmds = append(cmds, fmt.Sprintf("set server %s addr %s port %d", ref, w.Addr.Addr(), w.Addr.Port()))
	}
	if s.Weight != w.Int {
		cmds = append(cmds, fmt.Sprintf("set server %s weight %d", ref, w.Int))
	}
	if o.MaxConn && w.MaxConcurrency > 0 && s.MaxConn != w.MaxConcurrency {
		cmds = append(cmds, fmt.Sprintf("set maxconn server %s %d", ref, w.MaxConcurrency))
	}
	if s.maint() || s.drain() {
		cmds = append(cmds, "set server "+ref+" state ready")
	}
	return cmds
}

// answerOK reports whether an answer to a "set"/"add" command means it was
// taken. HAProxy answers nothing, or a note of what changed.
func answerOK(ans string) bool {
	a := strings.TrimSpace(ans)
	return a == "" || strings.Contains(a, "changed from") || strings.Contains(a, "no need to change") ||
		strings.HasPrefix(a, "New server registered")
}
