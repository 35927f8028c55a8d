package envoy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/envoy"
	"heft/gateway/gwtest"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/testutil"
	"heft/shared/view"
)

// firstAssignment opens an EDS stream to addr and returns the weights of
// the first assignment of cluster.
func firstAssignment(t *testing.T, addr, cluster string) map[string]uint32 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eds, err := endpointservice.NewEndpointDiscoveryServiceClient(dial(t, addr)).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := eds.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resourcev3.EndpointType,
		ResourceNames: []string{cluster}}); err != nil {
		t.Fatal(err)
	}
	_, clas := recv(t, eds)
	return weights(clas[cluster])
}

func TestStateFileKeepsWhatWasPublished(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qwen.json")
	s := startServer(t)
	c := s.Cluster(model, "qwen").KeepingState(path)
	if got, err := c.Served(context.Background()); err != nil || got != nil {
		t.Fatalf("before the first publish: %v, %v; want nothing and no error", got, err)
	}
	if err := c.Check(context.Background()); err != nil {
		t.Fatalf("check with no state file yet: %v", err)
	}
	if _, err := c.Apply(context.Background(), desired(
		gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1.37),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 0.63),
		gwtest.Worker(model, "10.0.0.3:8000", view.StateHeld, 0),
	)); err != nil {
		t.Fatal(err)
	}
	got, err := c.Served(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []target.Served{{Address: "10.0.0.1:8000", Weight: 137, Owned: true}, {Address: "10.0.0.2:8000", Weight: 63, Owned: true}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("read back %v, want %v (the held worker was not published)", got, want)
	}
	if w := firstAssignment(t, s.Addr(), "qwen"); len(w) != 2 || w["10.0.0.1:8000"] != 137 {
		t.Fatalf("Envoy got %v", w)
	}
	// A new publish replaces it; an apply that publishes nothing new
	// leaves the file as it is.
	if _, err := c.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if got, _ := c.Served(context.Background()); len(got) != 1 || got[0].Address != "10.0.0.2:8000" || got[0].Weight != 1 {
		t.Fatalf("after the second publish: %v", got)
	}
	if _, err := c.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(path); !os.SameFile(st, st2) {
		t.Fatal("an unchanged apply rewrote the state file")
	}
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("state file mode %v, want 0640", st.Mode().Perm())
	}
}

// A state file that is not this cluster's, or not well formed, is an
// error: the floor then starts from the coordinator alone, and the next
// publish replaces the file.
func TestStateFileBadInput(t *testing.T) {
	cases := map[string]string{
		"not JSON":         "endpoints: [10.0.0.1:8000]\n",
		"another cluster":  `{"cluster":"other","model":"m","endpoints":[]}`,
		"text after":       `{"cluster":"qwen","model":"m","endpoints":[]} {}`,
		"unknown field":    `{"cluster":"qwen","model":"m","endpoints":[],"extra":1}`,
		"host name":        `{"cluster":"qwen","model":"m","endpoints":[{"address":"engine:8000","weight":5}]}`,
		"no port":          `{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.1:0","weight":5}]}`,
		"weight 0":         `{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.1:8000","weight":0}]}`,
		"weight too large": `{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.1:8000","weight":1001}]}`,
		"negative weight":  `{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.1:8000","weight":-3}]}`,
		"NaN weight":       `{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.1:8000","weight":NaN}]}`,
		"oversized":        `{"cluster":"qwen","model":"` + strings.Repeat("x", 5<<20) + `","endpoints":[]}`,
	}
	s, err := envoy.NewServer("127.0.0.1:0", hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for name, text := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "qwen.json")
			if err := os.WriteFile(path, []byte(text), 0o640); err != nil {
				t.Fatal(err)
			}
			c := s.Cluster(model, "qwen").KeepingState(path)
			got, err := c.Served(context.Background())
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("read %v, %v: want an error naming the file", got, err)
			}
			if err := c.Check(context.Background()); err == nil {
				t.Fatal("check passed")
			}
			if _, err := c.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1))); err != nil {
				t.Fatal(err)
			}
			if got, err := c.Served(context.Background()); err != nil || len(got) != 1 {
				t.Fatalf("after a publish: %v, %v", got, err)
			}
		})
	}
}

// A state file that cannot be written fails the apply as a write, but
// Envoy gets the assignment all the same.
func TestStateFileThatCannotBeWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "qwen.json")
	s := startServer(t)
	c := s.Cluster(model, "qwen").KeepingState(path)
	if err := c.Check(context.Background()); err == nil {
		t.Fatal("check passed with the state file's folder missing")
	}
	res, err := c.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)))
	if err == nil || target.Reason(err) != target.ReasonWrite || len(res.Changes) != 1 {
		t.Fatalf("apply: %+v, %v: want a write failure after the publish", res, err)
	}
	if w := firstAssignment(t, s.Addr(), "qwen"); len(w) != 1 {
		t.Fatalf("Envoy got %v", w)
	}
}

// heft-sync restarts while the coordinator lists two of three workers as
// measuring (it restarted on an empty state). Envoy kept what the old
// heft-sync published; the new one's first assignment keeps the two as
// they were, in the measured worker's units, where without a state file
// it takes them out.
func TestRestartedSyncKeepsEnvoyServingWhileMeasuring(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "state file", false: "none"}[keep], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "qwen.json")
			if !keep {
				path = ""
			}
			before := startServer(t).Cluster(model, "qwen").KeepingState(path)
			if _, err := before.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1),
				gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 3), gwtest.Worker(model, "10.0.0.3:8000", view.StateAdmitted, 2))); err != nil {
				t.Fatal(err)
			}

			s := startServer(t)
			c := s.Cluster(model, "qwen").KeepingState(path)
			sy := syncer.New([]target.Target{c}, syncer.NewMetrics([]string{c.Name()}), time.Hour, hclog.New(&hclog.LoggerOptions{Output: t.Output()}))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { sy.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			sy.Update(coord.Snapshot{At: time.Now(), Workers: []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1),
				gwtest.Worker(model, "10.0.0.2:8000", view.StateMeasuring, 0), gwtest.Worker(model, "10.0.0.3:8000", view.StateMeasuring, 0)}})
			testutil.Eventually(t, "the first apply", 10*time.Second, func() bool { return sy.Status().Targets[0].Applied })
			w := firstAssignment(t, s.Addr(), "qwen")
			if !keep {
				if len(w) != 1 {
					t.Fatalf("without a state file Envoy got %v: want the measuring workers taken out, as before", w)
				}
				return
			}
			a, b, cc := float64(w["10.0.0.1:8000"]), float64(w["10.0.0.2:8000"]), float64(w["10.0.0.3:8000"])
			if len(w) != 3 || a == 0 || b/a < 2.9 || b/a > 3.1 || cc/a < 1.9 || cc/a > 2.1 {
				t.Fatalf("Envoy got %v: want all three, 1:3:2 as before the restart", w)
			}
			if kept := sy.Status().Targets[0].Kept; len(kept) != 2 {
				t.Fatalf("kept %v, want the two measuring workers", kept)
			}
		})
	}
}

func TestStateFileValidate(t *testing.T) {
	err := envoy.Config{Listen: "127.0.0.1:18000", Model: model, StateFile: "/var/lib/heft-sync/"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "state_file") {
		t.Fatalf("a folder as state_file: %v", err)
	}
	if err := (envoy.Config{Listen: "127.0.0.1:18000", Model: model, StateFile: "/var/lib/heft-sync/qwen.json"}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// An Envoy that connects to a restarted heft-sync before the cluster's
// first apply (the coordinator lists no worker of the model yet) gets what
// was last published, not an empty cluster.
func TestStateFileIsPublishedBeforeTheFirstApply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qwen.json")
	before := startServer(t).Cluster(model, "qwen").KeepingState(path)
	if _, err := before.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 3))); err != nil {
		t.Fatal(err)
	}
	s := startServer(t)
	s.Cluster(model, "qwen").KeepingState(path)
	last, err := before.Served(context.Background())
	if err != nil || len(last) != 2 {
		t.Fatalf("state file: %v, %v", last, err)
	}
	w := firstAssignment(t, s.Addr(), "qwen")
	if len(w) != 2 || float64(w["10.0.0.1:8000"]) != last[0].Weight || float64(w["10.0.0.2:8000"]) != last[1].Weight {
		t.Fatalf("before any apply Envoy got %v: want what was last published, %v", w, last)
	}
}

// A state file that cannot be read publishes nothing: the first thing an
// Envoy gets is the first apply.
func TestUnreadableStateFileWaitsForTheFirstApply(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qwen.json")
	if err := os.WriteFile(path, []byte(`{"cluster":"qwen","model":"m","endpoints":[{"address":"10.0.0.9:8000","weight":0}]}`), 0o640); err != nil {
		t.Fatal(err)
	}
	s := startServer(t)
	c := s.Cluster(model, "qwen").KeepingState(path)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eds, err := endpointservice.NewEndpointDiscoveryServiceClient(dial(t, s.Addr())).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := eds.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "envoy-1"}, TypeUrl: resourcev3.EndpointType,
		ResourceNames: []string{"qwen"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	if _, clas := recv(t, eds); len(weights(clas["qwen"])) != 1 || weights(clas["qwen"])["10.0.0.1:8000"] == 0 {
		t.Fatalf("Envoy first got %v: want the first apply", weights(clas["qwen"]))
	}
}

// Envoy reconnects to a restarted heft-sync saying the version it has,
// and the new process counts its versions from 1 again. go-control-plane
// answers a stream's first request for a resource whatever its version,
// so one that reached the same count still sends its assignment; this
// keeps that true across upgrades of it.
func TestRestartedServerSendsAtTheSameCount(t *testing.T) {
	old := startServer(t)
	if _, err := old.Cluster(model, "qwen").Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := &corev3.Node{Id: "envoy-1"}
	eds, err := endpointservice.NewEndpointDiscoveryServiceClient(dial(t, old.Addr())).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := eds.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"qwen"}}); err != nil {
		t.Fatal(err)
	}
	had, _ := recv(t, eds)

	s := startServer(t)
	if _, err := s.Cluster(model, "qwen").Apply(context.Background(), desired(gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1))); err != nil {
		t.Fatal(err)
	}
	again, err := endpointservice.NewEndpointDiscoveryServiceClient(dial(t, s.Addr())).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{"qwen"},
		VersionInfo: had.VersionInfo}); err != nil {
		t.Fatal(err)
	}
	if _, clas := recv(t, again); weights(clas["qwen"])["10.0.0.2:8000"] == 0 {
		t.Fatalf("after the restart Envoy got %v", weights(clas["qwen"]))
	}
}
