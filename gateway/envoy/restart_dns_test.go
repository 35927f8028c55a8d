package envoy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/envoy"
	"heft/gateway/gwtest"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

// startServerLogging is startServer with its log also in w.
func startServerLogging(t *testing.T, w *testutil.SyncBuffer) *envoy.Server {
	t.Helper()
	s, err := envoy.NewServer("127.0.0.1:0", hclog.New(&hclog.LoggerOptions{Output: w, Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// restartMidOutage publishes a, b and x by DNS name, then restarts
// heft-sync (a new server and cluster on the same state file) while x's
// name fails and b's has moved to 10.0.0.9, and applies once. corrupt, when
// set, is written over the DNS answers file before the restart.
func restartMidOutage(t *testing.T, corrupt string) (map[string]uint32, *envoy.Cluster, string, *testutil.SyncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qwen.json")
	named := func(host string) view.Worker { return gwtest.Worker(model, host+":8000", view.StateAdmitted, 1) }
	m := desired(named("gpu-a.heft.test"), named("gpu-b.heft.test"), named("gpu-x.heft.test"))
	before := startServer(t).Cluster(model, "qwen").KeepingState(path).UseLookup(gwtest.NewDNS(map[string]string{
		"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2", "gpu-x.heft.test": "10.0.0.7"}).Lookup)
	if res, err := before.Apply(context.Background(), m); err != nil || res.Serving != 3 {
		t.Fatalf("before the restart: %+v %v", res, err)
	}
	if corrupt != "" {
		if err := os.WriteFile(envoy.AnswersFile(path), []byte(corrupt), 0o640); err != nil {
			t.Fatal(err)
		}
	}

	// x's name fails (never to resolve for the new heft-sync), b's moved.
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.9"})
	var logs testutil.SyncBuffer
	s := startServerLogging(t, &logs)
	after := s.Cluster(model, "qwen").KeepingState(path).UseLookup(dns.Lookup)
	res, err := after.Apply(context.Background(), m)
	if target.Reason(err) != target.ReasonResolve || !strings.Contains(err.Error(), "gpu-x") {
		t.Fatalf("apply after the restart (%+v): %v, want x's resolve error", res, err)
	}
	return firstAssignment(t, s.Addr(), "qwen"), after, path, &logs
}

// A heft-sync restarted during a DNS outage reads back the answers the one
// before it kept: b, whose name moved, leaves its old endpoint, and x, whose
// name fails, keeps its last good one. Before, the new heft-sync knew
// neither, so it kept every endpoint no resolved worker was at, the moved
// worker's old one too, until x's name resolved again.
func TestRestartedSyncDropsAMovedNamesOldEndpoint(t *testing.T) {
	w, after, path, _ := restartMidOutage(t, "")
	want := []string{"10.0.0.1:8000", "10.0.0.9:8000", "10.0.0.7:8000"}
	if len(w) != len(want) {
		t.Fatalf("Envoy got %v, want %v (none at b's old 10.0.0.2:8000)", w, want)
	}
	for _, a := range want {
		if w[a] == 0 {
			t.Fatalf("Envoy got %v, want %v", w, want)
		}
	}
	if saved, err := after.Served(context.Background()); err != nil || len(saved) != 3 {
		t.Fatalf("the state file holds %v, %v", saved, err)
	}
	// The state file has only the fields an older heft-sync reads.
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "heft.test") {
		t.Fatalf("the state file names DNS names, which an older heft-sync refuses:\n%s", data)
	}
}

// An answers file that is not one is a warning, and costs nothing: the
// restarted heft-sync keeps what it published, as one without the file
// does (the moved worker's old endpoint too, until x resolves), and
// writes a good file at once.
func TestCorruptAnswersFileLosesNothing(t *testing.T) {
	w, _, path, logs := restartMidOutage(t, "{\"answers\": [{\"address\": \"gpu-b.heft.test:8000\", \"resolved\": \"10.0.0.2:9999\"}]}")
	if !strings.Contains(logs.String(), "the DNS answers file cannot be read") {
		t.Errorf("no warning for the corrupt file:\n%s", logs)
	}
	for _, a := range []string{"10.0.0.1:8000", "10.0.0.9:8000", "10.0.0.2:8000", "10.0.0.7:8000"} {
		if w[a] == 0 {
			t.Fatalf("Envoy got %v: a corrupt answers file took out %s", w, a)
		}
	}
	if err := target.ReadAnswers(envoy.AnswersFile(path)); err != nil {
		t.Fatalf("the answers file was not replaced: %v", err)
	}
	data, _ := os.ReadFile(envoy.AnswersFile(path))
	if !strings.Contains(string(data), `"resolved": "10.0.0.9:8000"`) {
		t.Fatalf("the answers file holds:\n%s", data)
	}
}

// Two workers at one IP:port are one endpoint, and the one kept takes its
// own old address with it: b, whose name moved onto the address of an
// offline worker listed before it, leaves its old endpoint while x's name
// has never resolved. Before, the kept worker carried the dropped one's
// old address (none), so b's old endpoint was kept as one x might be at.
func TestMovedNameThatCollidesLeavesItsOldEndpoint(t *testing.T) {
	dns := gwtest.NewDNS(map[string]string{"gpu-a.heft.test": "10.0.0.1", "gpu-b.heft.test": "10.0.0.2"})
	s := startServer(t)
	c := s.Cluster(model, "qwen").UseLookup(dns.Lookup)
	wa, wb := gwtest.Worker(model, "gpu-a.heft.test:8000", view.StateAdmitted, 1), gwtest.Worker(model, "gpu-b.heft.test:8000", view.StateAdmitted, 1)
	if res, err := c.Apply(context.Background(), desired(wa, wb)); err != nil || res.Serving != 2 {
		t.Fatalf("before the move: %+v %v", res, err)
	}
	dns.Set("gpu-b.heft.test", "10.0.0.9")
	res, err := c.Apply(context.Background(), desired(wa, wb,
		gwtest.Worker(model, "10.0.0.9:8000", view.StateOffline, 0),          // listed before b, and dropped
		gwtest.Worker(model, "gpu-x.heft.test:8000", view.StateAdmitted, 1))) // never resolves
	if target.Reason(err) != target.ReasonResolve {
		t.Fatalf("apply after the move (%+v): %v, want x's resolve error", res, err)
	}
	if w := firstAssignment(t, s.Addr(), "qwen"); len(w) != 2 || w["10.0.0.1:8000"] == 0 || w["10.0.0.9:8000"] == 0 {
		t.Fatalf("after the move (%+v): Envoy got %v, want a and b at its new address only", res, w)
	}
}
