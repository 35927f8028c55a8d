package bench

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What the bench reads back from the gateways is read its own way (HAProxy's
// "show stat", the nginx file as text), not through heft-sync's code, so a
// mistake there cannot hide itself.

// hxServer is one server of a backend as HAProxy's "show stat" reports it.
type hxServer struct {
	Name    string
	Addr    string // ip:port
	Status  string // "no check" (serving, no health check), "DRAIN", "MAINT", …
	Weight  int
	MaxConn int // slim; 0 = none
}

// serving reports whether the server takes new requests.
func (s hxServer) serving() bool { return s.Status == "no check" || s.Status == "UP" }

func (s hxServer) String() string {
	out := fmt.Sprintf("%s %s %s w=%d", s.Name, s.Addr, s.Status, s.Weight)
	if s.MaxConn > 0 {
		out += fmt.Sprintf(" maxconn=%d", s.MaxConn)
	}
	return out
}

// haproxyStat asks HAProxy's admin socket for a backend's servers.
func haproxyStat(ctx context.Context, socket, backend string) ([]hxServer, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// Type 4: servers only; -1: all of them.
	if _, err := fmt.Fprintf(c, "show stat %s 4 -1\n", backend); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(c)
	if err != nil {
		return nil, err
	}
	text := strings.TrimPrefix(strings.TrimSpace(string(data)), "# ")
	r := csv.NewReader(strings.NewReader(text))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) < 1 {
		return nil, fmt.Errorf("haproxy show stat %s: unexpected answer %q", backend, clipText(text))
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	for _, need := range []string{"pxname", "svname", "status", "weight", "slim", "addr"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("haproxy show stat has no %s column: %q", need, clipText(text))
		}
	}
	var out []hxServer
	for _, row := range rows[1:] {
		if len(row) < len(rows[0]) || row[col["pxname"]] != backend {
			continue
		}
		w, _ := strconv.Atoi(row[col["weight"]])
		mc, _ := strconv.Atoi(row[col["slim"]])
		out = append(out, hxServer{Name: row[col["svname"]], Addr: row[col["addr"]], Status: row[col["status"]], Weight: w, MaxConn: mc})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("haproxy has no backend %q with servers", backend)
	}
	return out, nil
}

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// ngServer is one server of an nginx upstream file.
type ngServer struct {
	Addr   string
	Weight int // 1 when not written
	Down   bool
}

// nginxServers reads the servers of the upstream file heft-sync writes.
func nginxServers(path string) ([]ngServer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []ngServer
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		line, _, ok := strings.Cut(line, ";")
		f := strings.Fields(line)
		if !ok || len(f) < 2 || f[0] != "server" {
			continue
		}
		s := ngServer{Addr: f[1], Weight: 1}
		for _, p := range f[2:] {
			if w, ok := strings.CutPrefix(p, "weight="); ok {
				if s.Weight, err = strconv.Atoi(w); err != nil {
					return nil, fmt.Errorf("%s: bad weight in %q", path, line)
				}
			}
			s.Down = s.Down || p == "down"
		}
		out = append(out, s)
	}
	return out, nil
}

// weightsBy writes what each worker carries, in routingWorkers order,
// e.g. "fast 137, mid 63, slow 21, dp2 drained".
func (f *routingFleet) weightsBy(carried func(addr string) (string, bool)) string {
	parts := make([]string, len(routingWorkers))
	for i, c := range routingWorkers {
		if w, ok := carried(f.simAddr(i)); ok {
			parts[i] = c.Name + " " + w
		} else {
			parts[i] = c.Name + " drained"
		}
	}
	return strings.Join(parts, ", ")
}

// describeApplied says what each gateway carries once heft-sync has
// applied heft's state, and what the oracle configs carry.
func (f *routingFleet) describeApplied(ctx context.Context, policies []policy) ([]string, error) {
	var out []string
	for _, p := range policies {
		if p.Weights != weightsHeft {
			continue
		}
		switch p.Gateway {
		case gwHAProxy:
			servers, err := haproxyStat(ctx, f.socket, p.Key)
			if err != nil {
				return nil, err
			}
			var order []string
			desc := f.weightsBy(func(addr string) (string, bool) {
				for _, s := range servers {
					if s.Addr == addr && s.serving() {
						if s.MaxConn > 0 {
							return fmt.Sprintf("%d (maxconn %d)", s.Weight, s.MaxConn), true
						}
						return strconv.Itoa(s.Weight), true
					}
				}
				return "", false
			})
			for _, s := range servers {
				if s.serving() {
					if i := f.workerAt(s.Addr); i >= 0 {
						order = append(order, routingWorkers[i].Name)
					}
				}
			}
			if p.Balance == "first" {
				desc += "; slot order " + strings.Join(order, ", ")
			}
			out = append(out, fmt.Sprintf("%s: %s", p, desc))
		case gwNginx:
			servers, err := nginxServers(f.heftFile)
			if err != nil {
				return nil, err
			}
			out = append(out, fmt.Sprintf("%s: %s", p, f.weightsBy(func(addr string) (string, bool) {
				i := slices.IndexFunc(servers, func(s ngServer) bool { return s.Addr == addr })
				if i < 0 || servers[i].Down {
					return "", false
				}
				return strconv.Itoa(servers[i].Weight), true
			})))
		}
	}
	return out, nil
}

// gatewayState is what a gateway carries for one heft-driven policy, as
// text that compares equal when nothing changed.
func (f *routingFleet) gatewayState(ctx context.Context, p policy) (string, error) {
	if p.Gateway == gwNginx {
		data, err := os.ReadFile(f.heftFile)
		return string(data), err
	}
	servers, err := haproxyStat(ctx, f.socket, p.Key)
	if err != nil {
		return "", err
	}
	lines := make([]string, len(servers))
	for i, s := range servers {
		lines[i] = s.String()
	}
	return strings.Join(lines, "\n"), nil
}

// serves reports whether a policy's gateway still sends new requests to
// the worker at addr.
func (f *routingFleet) serves(ctx context.Context, p policy, addr string) (bool, error) {
	if p.Gateway == gwNginx {
		servers, err := nginxServers(f.heftFile)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(servers, func(s ngServer) bool { return s.Addr == addr && !s.Down }), nil
	}
	servers, err := haproxyStat(ctx, f.socket, p.Key)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(servers, func(s hxServer) bool { return s.Addr == addr && s.serving() }), nil
}
