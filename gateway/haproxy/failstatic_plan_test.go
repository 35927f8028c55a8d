package haproxy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/target"
)

// unresolved is a serving worker whose address never resolved.
func unresolved(name string) want {
	return want{Backend: target.Backend{Address: name, WorkerID: "w-" + name, Serving: true, Weight: 1, State: "admitted"}}
}

// While a serving worker's address is unknown, heft's servers that no
// resolved worker claims are left as they are (not drained, not put in
// maintenance, not given to another worker); a free slot in maintenance
// is still used, and a held worker is still drained.
func TestPlanLeavesServersOfUnresolvedWorkers(t *testing.T) {
	servers := []server{
		{ID: 1, Name: "heft1", Addr: ap("10.0.0.1:8000"), Weight: 1},                          // the unresolved worker's, maybe
		{ID: 2, Name: "heft2", Addr: ap("10.0.0.3:8000"), Weight: 1},                          // a held worker's
		{ID: 3, Name: "heft3", Addr: ap("127.0.0.1:9"), Admin: admForcedMaint | 4, Weight: 1}, // free
		{ID: 4, Name: "heft-10.0.0.7-8000", Addr: ap("10.0.0.7:8000"), Weight: 1},             // added: maybe the unresolved worker's
	}
	ws := []want{unresolved("gpu-a:8000"), serving("10.0.0.2:8000", 1), drained("10.0.0.3:8000", "held")}
	p := makePlan(servers, ws, opts)
	want := []string{
		"set server qwen/heft3 addr 10.0.0.2 port 8000",
		"set server qwen/heft3 state ready",
		"set server qwen/heft2 state drain",
	}
	if !slices.Equal(p.cmds, want) || len(p.soft) != 0 {
		t.Fatalf("commands:\n%s\nsoft %v\nwant:\n%s", strings.Join(p.cmds, "\n"), p.soft, strings.Join(want, "\n"))
	}
	if p.serving != 3 {
		t.Fatalf("serving %d, want 3 (two left as they are, one new)", p.serving)
	}

	// By weight the same while a server is unknown: the order would move
	// workers between slots; a held worker is still drained at its own.
	o := opts
	o.ByWeight = true
	if p := makePlan(servers, ws, o); !slices.Equal(p.cmds, want) || len(p.soft) != 0 {
		t.Fatalf("by weight: commands %v soft %v, want\n%s", p.cmds, p.soft, strings.Join(want, "\n"))
	}
	// An unresolved worker that is not serving needs no server.
	ws[0].Serving = false
	if p := makePlan(servers, ws, opts); !slices.Contains(p.cmds, "set server qwen/heft-10.0.0.7-8000 state maint") {
		t.Fatalf("commands %v: want the unclaimed server in maintenance", p.cmds)
	}
}

// fakeSocket answers "show servers state" with state and refuses every
// address change; it records the other commands.
type fakeSocket struct {
	state string
	sent  []string
}

func (f *fakeSocket) run(_ context.Context, cmd string) (string, error) {
	switch {
	case strings.HasPrefix(cmd, "show servers state"):
		return f.state, nil
	case strings.Contains(cmd, " addr "):
		return "Invalid addr.\n", nil
	}
	f.sent = append(f.sent, cmd)
	return "", nil
}

// When HAProxy refuses a slot's new address, the slot is left as it was:
// no weight and no "state ready" for whatever it still carries.
func TestRefusedAddressLeavesServer(t *testing.T) {
	const head = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n"
	f := &fakeSocket{state: head +
		"3 qwen 1 heft1 10.0.0.1 2 0 1 1 1 1 0 2 0 0 0 0 - 8000 - 0 0 - - 0\n" +
		"3 qwen 2 heft2 10.0.0.9 2 1 1 1 1 1 0 2 0 0 0 0 - 8000 - 0 0 - - 0\n"} // maintenance, at a drained worker's address
	h, err := New(Config{Model: "m", Socket: "/nonexistent", Backend: "qwen"}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	h.c = f
	m := target.Model{Name: "m", Backends: []target.Backend{
		{Address: "10.0.0.1:8000", Scheme: "http", WorkerID: "a", State: "admitted", Serving: true, Weight: 3},
		{Address: "10.0.0.2:8000", Scheme: "http", WorkerID: "b", State: "admitted", Serving: true, Weight: 1},
	}}
	res, err := h.Apply(context.Background(), m)
	if err == nil {
		t.Fatal("a refused address change was not reported")
	}
	for _, c := range f.sent {
		if strings.Contains(c, "qwen/heft2 ") {
			t.Errorf("sent %q to the slot whose address change was refused", c)
		}
	}
	if !slices.ContainsFunc(f.sent, func(c string) bool { return strings.HasPrefix(c, "set server qwen/heft1 weight ") }) {
		t.Errorf("sent %v: the other slot's commands must still go", f.sent)
	}
	t.Logf("changes %v, error %v", res.Changes, err)
}
