package haproxy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/gwtest"
	"heft/gateway/haproxy"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

// restartMidOutage serves a, b (by a DNS name) and c in the three slots
// with a state file, then, b's name moved to 127.0.0.2 and x's never
// resolving, restarts heft-sync (a new target on the same state file) and
// applies once with b in state. corrupt, when set, is written over the
// state file before the restart.
func restartMidOutage(t *testing.T, path, state, corrupt string) (threeWithB, *gwtest.Upstream, target.Result, *testutil.SyncBuffer, error) {
	t.Helper()
	f := threeWithBNamedKeeping(t, path)
	moved := gwtest.NewUpstreamAt(t, "b-moved", "127.0.0.2:"+port(f.b.Addr))
	if split := gwtest.Split(t, "http://"+f.hx.Front+"/", 30); split["b"] != 10 {
		t.Fatalf("before the move: %v", split)
	}
	if corrupt != "" {
		if err := os.WriteFile(path, []byte(corrupt), 0o640); err != nil {
			t.Fatal(err)
		}
	}

	f.dns.Set("gpu-b.heft.test", "127.0.0.2")
	var logs testutil.SyncBuffer
	after, err := haproxy.New(haproxy.Config{Model: model, Socket: f.hx.Socket, Backend: "qwen", StateFile: path},
		hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	after.UseLookup(f.dns.Lookup)
	res, err := after.Apply(context.Background(), desired(gwtest.Worker(model, f.a.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, f.named, state, 1), gwtest.Worker(model, f.c.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-x.heft.test:8000", view.StateAdmitted, 1))) // never resolves
	return f, moved, res, &logs, err
}

// A heft-sync restarted during a DNS outage reads back the answers the one
// before it kept in its state file: b, whose name moved, takes the slot at
// its old address (re-addressed, or drained there when held), so no request
// goes to the address its engine left. Before, the new heft-sync did not
// know b's old address: that slot was left as it was, since it could carry
// the unresolved x, and b, with no free slot, waited (no_slot) until x's
// name resolved.
func TestRestartedSyncMovesANameWhileAnotherIsUnresolved(t *testing.T) {
	for _, state := range []string{view.StateAdmitted, view.StateHeld} {
		t.Run(state, func(t *testing.T) {
			f, moved, res, _, err := restartMidOutage(t, filepath.Join(t.TempDir(), "haproxy-qwen.json"), state, "")
			if target.Reason(err) != target.ReasonResolve || strings.Contains(err.Error(), "has no server") {
				t.Fatalf("apply (changes %v): %v, want only the unresolved name's error", res.Changes, err)
			}
			split := gwtest.Split(t, "http://"+f.hx.Front+"/", 30)
			if split["b"] != 0 || split["a"] == 0 || split["c"] == 0 {
				t.Fatalf("after the restart (changes %v): %v, want none at b's old address", res.Changes, split)
			}
			if serving := state == view.StateAdmitted; (split["b-moved"] > 0) != serving || moved.Hits() > 0 != serving {
				t.Fatalf("after the restart (changes %v): %v, want b at its new address only if it serves", res.Changes, split)
			}
		})
	}
}

// A state file that cannot be read is a warning and costs nothing: the
// restarted heft-sync does what one without it does (b waits for a slot,
// its old server left as it is, since x may be on it), and writes a good
// file at once.
func TestCorruptStateFileLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "haproxy-qwen.json")
	f, _, res, logs, err := restartMidOutage(t, path, view.StateAdmitted, "not json")
	if !strings.Contains(logs.String(), "the state file cannot be read") {
		t.Errorf("no warning for the corrupt file:\n%s", logs)
	}
	if target.Reason(err) != target.ReasonResolve {
		t.Fatalf("apply (changes %v): %v", res.Changes, err)
	}
	if split := gwtest.Split(t, "http://"+f.hx.Front+"/", 30); split["a"] != 10 || split["b"] != 10 || split["c"] != 10 {
		t.Fatalf("after the restart (changes %v): %v, want every server as it was", res.Changes, split)
	}
	if data, err := os.ReadFile(path); err != nil || target.ReadAnswers(path) != nil || !strings.Contains(string(data), "127.0.0.2") {
		t.Fatalf("the state file was not replaced (%v):\n%s", err, data)
	}
	if err := target.ReadAnswers(path); err != nil {
		t.Fatalf("the state file was not replaced: %v", err)
	}
}

// Two workers at one IP:port share a server, and the one kept takes its
// own old address with it: b, whose name moved onto the address of an
// offline worker listed before it, keeps the slot at its old address while
// x's name is unresolved. Before, the kept worker carried the dropped
// one's old address (none), so b's old slot was left as it was, serving
// the address b's engine left, and b waited for a free slot (no_slot).
func TestMovedNameThatCollidesLeavesItsOldAddress(t *testing.T) {
	f := threeWithBNamed(t)
	moved := gwtest.NewUpstreamAt(t, "b-moved", "127.0.0.2:"+port(f.b.Addr))
	f.dns.Set("gpu-b.heft.test", "127.0.0.2")
	res, err := f.h.Apply(context.Background(), desired(gwtest.Worker(model, f.a.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, "127.0.0.2:"+port(f.b.Addr), view.StateOffline, 0), // listed before b, and dropped
		gwtest.Worker(model, f.named, view.StateAdmitted, 1), gwtest.Worker(model, f.c.Addr, view.StateAdmitted, 1),
		gwtest.Worker(model, "gpu-x.heft.test:8000", view.StateAdmitted, 1))) // never resolves
	if target.Reason(err) != target.ReasonResolve || strings.Contains(err.Error(), "has no server") {
		t.Fatalf("apply (changes %v): %v, want only the unresolved name's error", res.Changes, err)
	}
	if len(res.Dropped) != 1 || !strings.Contains(res.Dropped[0], "w-127.0.0.2:") {
		t.Fatalf("dropped %q, want the offline worker", res.Dropped)
	}
	if split := gwtest.Split(t, "http://"+f.hx.Front+"/", 30); split["b"] != 0 || split["b-moved"] != 10 || moved.Hits() != 10 {
		t.Fatalf("after the move (changes %v): %v, want b at its new address only", res.Changes, split)
	}
}
