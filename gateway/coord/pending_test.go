package coord_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
)

// While connected, the follower reads the nodes waiting for approval
// every PendingEvery and hands each list to Hooks.Pending, never after
// it said it is disconnected.
func TestPendingNodesAreFollowed(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetToken("v1ewer")
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	c.SetPending("gpu-b", "gpu-a")
	var (
		mu        sync.Mutex
		lists     [][]string
		connected bool
		late      bool
	)
	hooks := coord.Hooks{
		Connected: func(c bool) { mu.Lock(); connected = c; mu.Unlock() },
		Pending: func(nodes []string) {
			mu.Lock()
			defer mu.Unlock()
			late = late || !connected
			lists = append(lists, nodes)
		},
	}
	client := &http.Client{}
	f, err := coord.New(coord.Config{URL: c.URL(), Token: "v1ewer", Client: client, PendingEvery: 20 * time.Millisecond,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond},
		hooks, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; client.CloseIdleConnections() })
	last := func() []string {
		mu.Lock()
		defer mu.Unlock()
		if len(lists) == 0 {
			return nil
		}
		return lists[len(lists)-1]
	}
	testutil.Eventually(t, "the pending nodes, in name order", 5*time.Second, func() bool {
		return slices.Equal(last(), []string{"gpu-a", "gpu-b"})
	})
	c.SetPending("gpu-b")
	testutil.Eventually(t, "gpu-a approved", 5*time.Second, func() bool { return slices.Equal(last(), []string{"gpu-b"}) })
	c.SetPending()
	testutil.Eventually(t, "none waiting", 5*time.Second, func() bool { l := last(); return l != nil && len(l) == 0 })

	// A coordinator that is away hands out no list, and the last one is
	// not handed out again as if it were new.
	c.Stop()
	testutil.Eventually(t, "disconnected", 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return !connected })
	mu.Lock()
	n := len(lists)
	mu.Unlock()
	time.Sleep(100 * time.Millisecond) // five read periods: none may hand out a list while disconnected
	mu.Lock()
	defer mu.Unlock()
	if len(lists) != n || late {
		t.Errorf("lists handed out while disconnected: %d then %d (late %v)", n, len(lists), late)
	}
}
