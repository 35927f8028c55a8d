package coord_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
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
	rec := start(t, coord.Config{URL: c.URL(), Token: "v1ewer", PendingEvery: 20 * time.Millisecond})
	last := func() []string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.pending) == 0 {
			return nil
		}
		return rec.pending[len(rec.pending)-1]
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
	testutil.Eventually(t, "disconnected", 5*time.Second, func() bool { return !rec.isConnected() })
	rec.mu.Lock()
	n := len(rec.pending)
	rec.mu.Unlock()
	time.Sleep(100 * time.Millisecond) // five read periods: none may hand out a list while disconnected
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.pending) != n || rec.late {
		t.Errorf("lists handed out while disconnected: %d then %d (late %v)", n, len(rec.pending), rec.late)
	}
}

// An answer that is not a list of names is refused whole, and a
// coordinator without the route says so.
func TestPendingNodesRefusesGarbage(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string // in the error; "" for none
		names  []string
	}{
		{http.StatusOK, `{"nodes":["b","a","b"]}`, "", []string{"a", "b"}},
		{http.StatusOK, `{"nodes":null}`, "not a workers document", nil},
		{http.StatusOK, `{"nodes":["a",""]}`, "list of names", nil},
		{http.StatusOK, `{"nodes":[]} {}`, "trailing data", nil},
		{http.StatusNotFound, `{"error":"no API route"}`, "older than heft-sync", nil},
		{http.StatusUnauthorized, `{"error":"token"}`, "token_file", nil},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		f, err := coord.New(coord.Config{URL: srv.URL}, coord.Hooks{}, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		names, err := f.PendingNodes(context.Background())
		srv.Close()
		if tc.want == "" && (err != nil || !slices.Equal(names, tc.names)) {
			t.Errorf("%s: %v %v, want %v", tc.body, names, err, tc.names)
		}
		if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%d %s: %v %v, want an error saying %q", tc.status, tc.body, names, err, tc.want)
		}
	}
}
