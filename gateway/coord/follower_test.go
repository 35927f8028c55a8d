package coord_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// recorder keeps what the hooks saw.
type recorder struct {
	mu        sync.Mutex
	snaps     []coord.Snapshot
	errs      []string
	connected bool
	pending   [][]string // each list Hooks.Pending was handed
	late      bool       // a list was handed while disconnected
}

func (r *recorder) hooks() coord.Hooks {
	return coord.Hooks{
		Snapshot:  func(s coord.Snapshot) { r.mu.Lock(); r.snaps = append(r.snaps, s); r.mu.Unlock() },
		Connected: func(c bool) { r.mu.Lock(); r.connected = c; r.mu.Unlock() },
		Error:     func(reason string, _ error) { r.mu.Lock(); r.errs = append(r.errs, reason); r.mu.Unlock() },
		Pending: func(nodes []string) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.late = r.late || !r.connected
			r.pending = append(r.pending, nodes)
		},
	}
}

func (r *recorder) count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.snaps) }

func (r *recorder) last() coord.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snaps[len(r.snaps)-1]
}

func (r *recorder) sawError(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		if e == reason {
			return true
		}
	}
	return false
}

func (r *recorder) isConnected() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.connected }

func start(t *testing.T, cfg coord.Config) *recorder {
	t.Helper()
	rec := &recorder{}
	client := &http.Client{}
	cfg.Client = client
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 20*time.Millisecond, 100*time.Millisecond
	}
	f, err := coord.New(cfg, rec.hooks(), hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; client.CloseIdleConnections() })
	return rec
}

func weightOf(s coord.Snapshot, id string) float64 {
	for _, w := range s.Workers {
		if w.ID == id && w.Weight != nil {
			return *w.Weight
		}
	}
	return -1
}

func TestFollowsChanges(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1.37))
	rec := start(t, coord.Config{URL: c.URL()})
	testutil.Eventually(t, "the first state", 5*time.Second, func() bool { return rec.count() > 0 })
	if !rec.isConnected() || weightOf(rec.last(), "w-10.0.0.1:8000") != 1.37 {
		t.Fatalf("first state: %+v", rec.last())
	}
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 0.63))
	testutil.Eventually(t, "the changed weight", 5*time.Second, func() bool {
		return weightOf(rec.last(), "w-10.0.0.1:8000") == 0.63
	})
}

func TestTokenAndUnauthorized(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetToken("v1ewer")
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	bad := start(t, coord.Config{URL: c.URL(), Token: "wrong"})
	good := start(t, coord.Config{URL: c.URL(), Token: "v1ewer"})
	testutil.Eventually(t, "the good token's state", 5*time.Second, func() bool { return good.count() > 0 })
	testutil.Eventually(t, "the wrong token's refusal", 5*time.Second, func() bool { return bad.sawError(coord.ReasonUnauthorized) })
	if bad.count() != 0 {
		t.Fatal("a refused follower handed out a state")
	}
}

// Garbage from the coordinator hands out nothing; a good answer later
// does.
func TestGarbageHandsOutNothing(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	rec := start(t, coord.Config{URL: c.URL()})
	testutil.Eventually(t, "the first state", 5*time.Second, func() bool { return rec.count() > 0 })
	c.SetGarbage(`{"workers":[{"weight":2}]}`)
	testutil.Eventually(t, "the garbage to be refused", 5*time.Second, func() bool { return rec.sawError(coord.ReasonGarbage) })
	// The first good state may be handed out twice (the list, then the
	// stream's first event); what must never appear is the garbage's worker.
	if last := rec.last(); len(last.Workers) != 1 || weightOf(last, "w-10.0.0.1:8000") != 1 {
		t.Fatalf("garbage was handed out: %+v", last)
	}
	c.SetStatus(http.StatusInternalServerError)
	testutil.Eventually(t, "a 500 to be refused", 5*time.Second, func() bool { return rec.sawError(coord.ReasonStatus) })
	c.SetStatus(0)
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 2))
	testutil.Eventually(t, "the state after the coordinator mended", 5*time.Second, func() bool {
		return weightOf(rec.last(), "w-10.0.0.1:8000") == 2
	})
}

// A coordinator that goes away and comes back is read again.
func TestCoordinatorRestart(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	rec := start(t, coord.Config{URL: c.URL()})
	testutil.Eventually(t, "the first state", 5*time.Second, func() bool { return rec.count() > 0 })
	c.Stop()
	testutil.Eventually(t, "the loss to be seen", 5*time.Second, func() bool { return !rec.isConnected() })
	n := rec.count()
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 3))
	if rec.count() != n {
		t.Fatal("a state arrived while the coordinator was down")
	}
	c.Start()
	testutil.Eventually(t, "the state after the restart", 5*time.Second, func() bool {
		return rec.isConnected() && weightOf(rec.last(), "w-10.0.0.1:8000") == 3
	})
}

// A stream that goes silent is dropped and opened again.
func TestStaleStream(t *testing.T) {
	var mu sync.Mutex
	streams := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/workers":
			w.Write([]byte(`{"workers":[]}`))
		case "/api/v1/events":
			mu.Lock()
			streams++
			mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			<-r.Context().Done() // silent: no event, no ping
		}
	}))
	defer srv.Close()
	rec := start(t, coord.Config{URL: srv.URL, StaleAfter: 150 * time.Millisecond})
	testutil.Eventually(t, "the silent stream to be dropped", 5*time.Second, func() bool { return rec.sawError(coord.ReasonStale) })
	testutil.Eventually(t, "a second stream", 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return streams >= 2 })
}

func TestNewRefusesBadURL(t *testing.T) {
	for _, u := range []string{"", "ws://x:1", "http://", "::"} {
		if _, err := coord.New(coord.Config{URL: u}, coord.Hooks{}, hclog.NewNullLogger()); err == nil {
			t.Errorf("New(%q) took it", u)
		}
	}
}

// A viewer token rotated on the coordinator, and written to heft-sync's
// token file, is taken at the first refusal: the follower reads the file
// again. Before, it presented the token it started with until restarted,
// and handed out nothing while the gateways froze.
func TestRotatedTokenIsReadAgain(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetToken("old-viewer")
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	var mu sync.Mutex
	file := "old-viewer"
	rec := start(t, coord.Config{URL: c.URL(), Token: "old-viewer", ReadToken: func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		return file, nil
	}})
	testutil.Eventually(t, "the first state", 5*time.Second, func() bool { return rec.count() > 0 })

	mu.Lock()
	file = "new-viewer"
	mu.Unlock()
	c.SetToken("new-viewer")
	c.Stop() // the open stream ends; the next session is refused the old token
	c.Start()
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 2))
	testutil.Eventually(t, "the state read with the new token", 5*time.Second, func() bool {
		return rec.count() > 0 && weightOf(rec.last(), "w-10.0.0.1:8000") == 2
	})
	if !rec.sawError(coord.ReasonUnauthorized) {
		t.Error("the old token was never refused: the test did not rotate it")
	}
}

// A redirect is not followed: the coordinator's API never sends one, and
// following it would hand out the fleet another host lists (Go's client
// asks it without the token). Before, the follower took that fleet.
// A redirect within the coordinator's own host and port (a proxy in front
// of it adding a path) is followed, with the token.
func TestRedirectOnTheSameHostIsFollowed(t *testing.T) {
	c := gwtest.NewCoordinator(t)
	c.SetWorkers(gwtest.Worker("m", "10.0.0.1:8000", view.StateAdmitted, 1))
	target, _ := url.Parse(c.URL())
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path, ok := strings.CutPrefix(r.URL.Path, "/heft"); ok {
			r.URL.Path = path
			proxy.ServeHTTP(w, r)
			return
		}
		http.Redirect(w, r, "/heft"+r.URL.RequestURI(), http.StatusMovedPermanently)
	}))
	t.Cleanup(front.Close)
	rec := start(t, coord.Config{URL: front.URL})
	testutil.Eventually(t, "the fleet through the redirect", 5*time.Second, func() bool { return rec.count() > 0 })
	if w := rec.last().Workers; len(w) != 1 || w[0].Address != "10.0.0.1:8000" {
		t.Fatalf("got %+v", rec.last())
	}
}

func TestSameCoordinator(t *testing.T) {
	req := func(u string) *http.Request {
		r, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	from := []*http.Request{req("http://coord.example:7070/api/v1/workers")}
	for to, want := range map[string]bool{
		"http://coord.example:7070/heft/api/v1/workers": true,  // a path added
		"http://COORD.example:7070/api/v1/workers":      true,  // host names ignore case
		"https://coord.example/api/v1/workers":          true,  // upgraded to https
		"https://coord.example:8443/api/v1/workers":     true,  // upgraded, its own port
		"http://coord.example:7071/api/v1/workers":      false, // another port: another server
		"http://elsewhere.example:7070/api/v1/workers":  false,
		"https://elsewhere.example/api/v1/workers":      false,
	} {
		if got := coord.SameCoordinator(req(to), from) == nil; got != want {
			t.Errorf("redirect to %s followed %v, want %v", to, got, want)
		}
	}
	tls := []*http.Request{req("https://coord.example/api/v1/workers")}
	if coord.SameCoordinator(req("http://coord.example/api/v1/workers"), tls) == nil {
		t.Error("followed a redirect from https down to http")
	}
}

func TestRedirectIsNotFollowed(t *testing.T) {
	elsewhere := gwtest.NewCoordinator(t)
	elsewhere.SetWorkers(gwtest.Worker("m", "10.6.6.6:8000", view.StateAdmitted, 1))
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL()+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(redirect.Close)
	rec := start(t, coord.Config{URL: redirect.URL})
	testutil.Eventually(t, "the redirect refused", 5*time.Second, func() bool { return rec.sawError(coord.ReasonStatus) })
	if rec.count() != 0 {
		t.Fatalf("handed out the fleet of the host redirected to: %+v", rec.last())
	}
}
