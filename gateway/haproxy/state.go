package haproxy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"heft/shared/wire"
)

// server is one server of a backend as "show servers state" lists it.
type server struct {
	ID     int
	Name   string
	Addr   netip.AddrPort
	Admin  int // srv_admin_state bits
	Weight int // srv_uweight, the weight in force
	// MaxConn is the server's maxconn from "show stat"; -1 when not read.
	MaxConn int
	// Checked: HAProxy health-checks the server (its "check"), so an
	// engine that dies leaves the backend whatever heft says.
	Checked bool
}

// Admin state bits HAProxy 2.x reports (SRV_ADMF_*): forced maintenance
// (the runtime API's "state maint", or "disabled" in the file) and forced
// drain are what heft-sync sets and reads back; the other bits (inherited,
// resolution) are HAProxy's own.
const (
	admForcedMaint = 0x01
	admForcedDrain = 0x08
)

// chkConfigured is srv_check_state's bit for a server with "check"
// (CHK_ST_CONFIGURED).
const chkConfigured = 0x02

func (s server) maint() bool { return s.Admin&admForcedMaint != 0 }
func (s server) drain() bool { return s.Admin&admForcedDrain != 0 }

// parseServersState reads the answer to "show servers state BACKEND":
// a version line, a "# " header naming the columns, then one line per
// server. Columns are found by name so a later format with more columns
// still reads.
func parseServersState(answer string) ([]server, error) {
	lines := strings.Split(strings.TrimRight(answer, "\n"), "\n")
	if len(lines) < 2 || strings.TrimSpace(lines[0]) != "1" || !strings.HasPrefix(lines[1], "# ") {
		return nil, fmt.Errorf("unexpected answer to show servers state: %q", clip(answer))
	}
	col := map[string]int{}
	for i, name := range strings.Fields(strings.TrimPrefix(lines[1], "# ")) {
		col[name] = i
	}
	for _, need := range []string{"srv_id", "srv_name", "srv_addr", "srv_admin_state", "srv_uweight", "srv_port"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("show servers state has no %s column: %q", need, clip(lines[1]))
		}
	}
	var out []server
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < len(col) {
			return nil, fmt.Errorf("short line in show servers state: %q", clip(line))
		}
		num := func(name string) (int, error) { return strconv.Atoi(f[col[name]]) }
		id, err1 := num("srv_id")
		adm, err2 := num("srv_admin_state")
		w, err3 := num("srv_uweight")
		port, err4 := num("srv_port")
		if err := firstErr(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("bad number in show servers state line %q: %w", clip(line), err)
		}
		s := server{ID: id, Name: f[col["srv_name"]], Admin: adm, Weight: w, MaxConn: -1}
		if i, ok := col["srv_check_state"]; ok {
			if cs, err := strconv.Atoi(f[i]); err == nil {
				s.Checked = cs&chkConfigured != 0
			}
		}
		if ip, err := netip.ParseAddr(f[col["srv_addr"]]); err == nil && port >= 0 && port <= 65535 {
			s.Addr = netip.AddrPortFrom(ip.Unmap(), uint16(port))
		}
		out = append(out, s)
	}
	return out, nil
}

// parseMaxConn reads the CSV answer to "show stat BACKEND 4 -1" and
// returns each server's slim (its maxconn; 0 when it has none).
func parseMaxConn(answer string) (map[string]int, error) {
	lines := strings.Split(strings.TrimRight(answer, "\n"), "\n")
	if len(lines) < 1 || !strings.HasPrefix(lines[0], "# ") {
		return nil, fmt.Errorf("unexpected answer to show stat: %q", clip(answer))
	}
	head := strings.Split(strings.TrimPrefix(lines[0], "# "), ",")
	name, slim := -1, -1
	for i, h := range head {
		switch h {
		case "svname":
			name = i
		case "slim":
			slim = i
		}
	}
	if name < 0 || slim < 0 {
		return nil, fmt.Errorf("show stat has no svname or slim column")
	}
	out := map[string]int{}
	for _, line := range lines[1:] {
		f := strings.Split(line, ",")
		if len(f) <= max(name, slim) {
			continue
		}
		n := 0
		if f[slim] != "" {
			v, err := strconv.Atoi(f[slim])
			if err != nil {
				return nil, fmt.Errorf("bad slim %q for %s", f[slim], f[name])
			}
			n = v
		}
		out[f[name]] = n
	}
	return out, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func clip(s string) string { return wire.Clip(strings.TrimSpace(s), 200) }
