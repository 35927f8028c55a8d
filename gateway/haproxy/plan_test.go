package haproxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"heft/gateway/target"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func serving(addr string, w float64) want {
	return want{Backend: target.Backend{Address: addr, WorkerID: "w-" + addr, Serving: true, Weight: w, State: "admitted"}, Addr: ap(addr)}
}

func drained(addr, state string) want {
	return want{Backend: target.Backend{Address: addr, WorkerID: "w-" + addr, State: state}, Addr: ap(addr)}
}

var opts = planOptions{Backend: "qwen", Slots: "heft"}

func TestPlanByAddress(t *testing.T) {
	servers := []server{
		{ID: 1, Name: "gpu-a", Addr: ap("10.0.0.1:8000"), Weight: 1},                          // listed in the file
		{ID: 2, Name: "other", Addr: ap("10.0.0.9:8000"), Weight: 7},                          // not heft's
		{ID: 3, Name: "heft1", Addr: ap("127.0.0.1:9"), Admin: admForcedMaint | 4, Weight: 1}, // free slot
		{ID: 4, Name: "heft2", Addr: ap("10.0.0.3:8000"), Weight: 5},                          // slot of a held worker
		{ID: 5, Name: "heft3", Addr: ap("10.0.0.8:8000"), Weight: 5},                          // slot of a vanished worker
	}
	ws := []want{serving("10.0.0.1:8000", 1.37), serving("10.0.0.2:8000", 0.63), drained("10.0.0.3:8000", "held"), drained("10.0.0.4:8000", "measuring")}
	p := makePlan(servers, ws, opts)
	want := []string{
		"set server qwen/gpu-a weight 137",
		"set server qwen/heft1 addr 10.0.0.2 port 8000",
		"set server qwen/heft1 weight 63",
		"set server qwen/heft1 state ready",
		"set server qwen/heft2 state drain",
		"set server qwen/heft3 state maint",
	}
	if !slices.Equal(p.cmds, want) {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(p.cmds, "\n"), strings.Join(want, "\n"))
	}
	if len(p.problems) != 0 || p.serving != 2 || p.rounding > 1e-9 {
		t.Fatalf("problems %v serving %d rounding %g", p.problems, p.serving, p.rounding)
	}
	for _, c := range p.cmds {
		if strings.Contains(c, "/other ") {
			t.Fatalf("touched a server heft does not know: %s", c)
		}
	}
}

func TestPlanIsIdempotent(t *testing.T) {
	servers := []server{
		{ID: 1, Name: "heft1", Addr: ap("10.0.0.1:8000"), Weight: 137},
		{ID: 2, Name: "heft2", Addr: ap("10.0.0.2:8000"), Weight: 63},
		{ID: 3, Name: "heft3", Addr: ap("10.0.0.3:8000"), Admin: admForcedDrain, Weight: 1},
	}
	ws := []want{serving("10.0.0.1:8000", 1.37), serving("10.0.0.2:8000", 0.63), drained("10.0.0.3:8000", "offline")}
	if p := makePlan(servers, ws, opts); len(p.cmds) != 0 {
		t.Fatalf("a matching backend got commands: %v", p.cmds)
	}
}

func TestPlanNoSlotAndAddServers(t *testing.T) {
	servers := []server{{ID: 1, Name: "heft1", Addr: ap("10.0.0.1:8000"), Weight: 1}}
	ws := []want{serving("10.0.0.1:8000", 1), serving("10.0.0.2:8000", 1)}
	p := makePlan(servers, ws, opts)
	if len(p.problems) != 1 || target.Reason(p.problems[0]) != target.ReasonNoSlot {
		t.Fatalf("problems %v, want one no_slot", p.problems)
	}
	o := opts
	o.AddServers = true
	p = makePlan(servers, ws, o)
	if len(p.problems) != 0 || !slices.Contains(p.cmds, "add server qwen/heft-10.0.0.2-8000 10.0.0.2:8000 weight 1 check") ||
		!slices.Contains(p.cmds, "enable health qwen/heft-10.0.0.2-8000") {
		t.Fatalf("add_servers: %v %v", p.cmds, p.problems)
	}
	// A server heft added whose worker is gone is put in maintenance and deleted.
	servers = append(servers, server{ID: 2, Name: "heft-10.0.0.7-8000", Addr: ap("10.0.0.7:8000"), Weight: 1})
	p = makePlan(servers, ws[:1], o)
	if !slices.Contains(p.cmds, "set server qwen/heft-10.0.0.7-8000 state maint") || !slices.Equal(p.soft, []string{"del server qwen/heft-10.0.0.7-8000"}) {
		t.Fatalf("commands %v soft %v", p.cmds, p.soft)
	}
}

// By weight, the slots in ID order carry the serving workers heaviest
// first, for "balance first".
func TestPlanByWeight(t *testing.T) {
	servers := []server{
		{ID: 4, Name: "heft2", Addr: ap("127.0.0.1:9"), Admin: admForcedMaint, Weight: 1},
		{ID: 3, Name: "heft1", Addr: ap("127.0.0.1:9"), Admin: admForcedMaint, Weight: 1},
		{ID: 5, Name: "heft3", Addr: ap("127.0.0.1:9"), Admin: admForcedMaint, Weight: 1},
		{ID: 1, Name: "static", Addr: ap("10.0.0.2:8000"), Weight: 9},
	}
	o := opts
	o.ByWeight = true
	ws := []want{serving("10.0.0.1:8000", 0.3), serving("10.0.0.2:8000", 2.2), drained("10.0.0.4:8000", "held"), serving("10.0.0.3:8000", 1.0)}
	p := makePlan(servers, ws, o)
	var addrs []string
	for _, c := range p.cmds {
		if strings.Contains(c, " addr ") {
			addrs = append(addrs, c)
		}
	}
	want := []string{
		"set server qwen/heft2 addr 10.0.0.3 port 8000",
		"set server qwen/heft1 addr 10.0.0.2 port 8000",
		"set server qwen/heft3 addr 10.0.0.1 port 8000",
	}
	if !slices.Equal(addrs, want) {
		t.Fatalf("addresses:\n%s\nwant:\n%s", strings.Join(addrs, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range p.cmds {
		if strings.Contains(c, "/static ") {
			t.Fatalf("by weight, servers listed in the file are left alone: %s", c)
		}
	}
}

func TestParseServersState(t *testing.T) {
	ans := "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n" +
		"3 qwen 1 static1 127.0.0.1 2 0 10 10 1 1 0 2 14 0 0 0 - 9001 - 0 0 - - 0\n" +
		"3 qwen 2 heft1 ::1 0 5 1 1 1 1 0 0 8 0 0 0 - 9 - 0 0 - - 0\n\n"
	ss, err := parseServersState(ans)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 2 || ss[0].Name != "static1" || ss[0].Weight != 10 || ss[0].Addr != ap("127.0.0.1:9001") || ss[0].maint() {
		t.Fatalf("%+v", ss)
	}
	if !ss[0].Checked || ss[1].Checked {
		t.Fatalf("checked: %+v", ss)
	}
	if !ss[1].maint() || ss[1].Addr != ap("[::1]:9") {
		t.Fatalf("%+v", ss[1])
	}
	for _, bad := range []string{"", "Unknown command\n", "1\n# srv_id\nx\n"} {
		if _, err := parseServersState(bad); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
	mc, err := parseMaxConn("# pxname,svname,qcur,qmax,scur,smax,slim,stot\nqwen,heft1,0,0,0,0,16,0\nqwen,heft2,0,0,0,0,,0\n")
	if err != nil || mc["heft1"] != 16 || mc["heft2"] != 0 {
		t.Fatalf("parseMaxConn = %v %v", mc, err)
	}
}

// A worker ID is the coordinator's string: a problem names it escaped, on
// one line, as every other message and comment of heft-sync's does.
func TestProblemsEscapeWorkerIDs(t *testing.T) {
	w := serving("10.0.0.1:8000", 1)
	w.WorkerID = "w-1\nlevel=info msg=\"all good\""
	for _, o := range []planOptions{opts, {Backend: "qwen", Slots: "heft", ByWeight: true}} {
		p := makePlan(nil, []want{w}, o)
		if len(p.problems) != 1 || strings.Contains(p.problems[0].Error(), "\n") {
			t.Fatalf("problems %q, want one, on one line", p.problems)
		}
	}
}
