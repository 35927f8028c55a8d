package server

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// Actions by node: one worker on the node needs nothing more; several need
// ?model= or ?url=, else 409 with the candidates; no match is 404.
func TestActionsByNode(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0", "e1") // http://127.0.0.1:8000 and :8001
	b := connectAgent(t, ts, "gpu-b")
	b.snapshot("other", "e0")
	testutil.Eventually(t, "the workers", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 3 })

	type answer struct {
		view.Worker
		Error      string      `json:"error"`
		Candidates []candidate `json:"candidates"`
	}
	act := func(method, path, body string) (int, answer) {
		t.Helper()
		status, data, _ := ts.do(t, method, path, adminToken, strings.NewReader(body))
		var got answer
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatalf("%s %s: %d %s", method, path, status, data)
		}
		return status, got
	}

	if st, got := act("POST", "/api/v1/nodes/gpu-b/hold", ""); st != 200 || got.ID != "gpu-b/e0" || got.State != view.StateHeld {
		t.Errorf("hold the only worker of gpu-b: %d %+v", st, got)
	}
	st, got := act("POST", "/api/v1/nodes/gpu-a/hold", "")
	if ids := candidateIDs(got.Candidates); st != 409 || !strings.Contains(got.Error, "add ?model=MODEL or ?url=ENGINE_URL") ||
		!slices.Equal(ids, []string{"gpu-a/e0", "gpu-a/e1"}) {
		t.Errorf("hold on a node with two workers: %d %+v", st, got)
	}
	if st, got := act("POST", "/api/v1/nodes/gpu-a/hold?model=m", ""); st != 409 || len(got.Candidates) != 2 {
		t.Errorf("a model both serve: %d %+v", st, got)
	}
	if w, _ := ts.fleet.Worker("gpu-a/e0"); w.State == view.StateHeld {
		t.Fatal("an ambiguous name acted")
	}
	st, got = act("POST", "/api/v1/nodes/gpu-a/pin?url="+url.QueryEscape("http://127.0.0.1:8001/"), `{"weight":1.5}`)
	if st != 200 || got.ID != "gpu-a/e1" || got.PinnedWeight == nil || *got.PinnedWeight != 1.5 {
		t.Errorf("pin by URL (with a trailing slash): %d %+v", st, got)
	}
	if st, got := act("DELETE", "/api/v1/nodes/gpu-a/pin?url=http://127.0.0.1:8001&model=m", ""); st != 200 || got.ID != "gpu-a/e1" || got.PinnedWeight != nil {
		t.Errorf("unpin by URL and model: %d %+v", st, got)
	}
	if st, got := act("POST", "/api/v1/nodes/gpu-a/admit?url=http://127.0.0.1:8000", ""); st != 200 || got.ID != "gpu-a/e0" || got.AdminDecision != "admit" {
		t.Errorf("admit by URL: %d %+v", st, got)
	}
	if st, got := act("POST", "/api/v1/nodes/gpu-b/probe", ""); st != 200 || got.ProbeStatus != wire.ProbeRunning {
		t.Errorf("probe by node: %d %+v", st, got)
	}
	if env := b.read(); env.Type != wire.TypeProbeRequest || env.ProbeRequest.CapacityKey != "gpu-b/e0" {
		t.Errorf("gpu-b's agent got %+v", env)
	}

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		want                     string
		candidates               int
	}{
		{"unknown node", "POST", "/api/v1/nodes/gpu-z/hold", "", 404, `no worker on node "gpu-z"`, 0},
		{"no such model", "POST", "/api/v1/nodes/gpu-a/hold?model=nope", "", 404, `node "gpu-a" has no worker with model "nope"`, 2},
		{"misspelt selector", "POST", "/api/v1/nodes/gpu-a/hold?modle=m", "", 400, `unknown parameter "modle": this route takes model and url`, 0},
		{"empty selector", "POST", "/api/v1/nodes/gpu-a/hold?url=", "", 400, "given once, with a value", 0},
		{"bad weight", "POST", "/api/v1/nodes/gpu-b/pin", `{"weight":0}`, 400, `{"weight": <positive number>}: got 0`, 0},
		{"weight in the query", "POST", "/api/v1/nodes/gpu-b/pin?weight=2", ``, 400, `unknown parameter "weight"`, 0},
		{"no action", "POST", "/api/v1/nodes/gpu-b", "", 405, "POST is not allowed on /api/v1/nodes/gpu-b: use GET or HEAD or DELETE", 0},
		{"unknown action", "POST", "/api/v1/nodes/gpu-b/nope", "", 404, "use /api/v1/nodes/{node}/{action}", 0},
		{"wrong method", "GET", "/api/v1/nodes/gpu-b/hold", "", 405, "use POST", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, got := act(tc.method, tc.path, tc.body)
			if st != tc.status || !strings.Contains(got.Error, tc.want) || len(got.Candidates) != tc.candidates {
				t.Errorf("got %d %+v, want %d with %q and %d candidates", st, got, tc.status, tc.want, tc.candidates)
			}
		})
	}
	// The admin token comes first: a stranger learns nothing about nodes.
	status, body, _ := ts.do(t, "POST", "/api/v1/nodes/gpu-z/hold", "", nil)
	if status != http.StatusUnauthorized || !strings.Contains(errorMessage(t, body), "admin token") {
		t.Errorf("without a token: %d %s", status, body)
	}
}

func candidateIDs(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

// Every route answers a method it does not serve with 405, an Allow
// header and a JSON error; OPTIONS gets 204 with Allow; HEAD is served
// wherever GET is.
func TestMethodNotAllowed(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/api/v1/agent", "GET, HEAD"},
		{"POST", "/api/v1/workers", "GET, HEAD"},
		{"DELETE", "/api/v1/workers", "GET, HEAD"},
		{"PUT", "/api/v1/workers/abc", "GET, HEAD"},
		{"POST", "/api/v1/workers/abc", "GET, HEAD"},
		{"PUT", "/api/v1/workers/abc/pin", "POST, DELETE"},
		{"GET", "/api/v1/workers/abc/probe", "POST"},
		{"DELETE", "/api/v1/workers/abc/hold", "POST"},
		{"PATCH", "/api/v1/workers/abc/admit", "POST"},
		{"GET", "/api/v1/nodes/gpu-a/pin", "POST, DELETE"},
		{"DELETE", "/api/v1/nodes/gpu-a/admit", "POST"},
		{"POST", "/api/v1/models", "GET, HEAD"},
		{"PUT", "/api/v1/models/m/weights", "GET, HEAD"},
		{"POST", "/api/v1/events", "GET, HEAD"},
		{"POST", "/metrics", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"POST", "/", "GET, HEAD"},
		{"DELETE", "/app.js", "GET, HEAD"},
	} {
		status, body, hdr := ts.do(t, tc.method, tc.path, adminToken, nil)
		if status != http.StatusMethodNotAllowed || hdr.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, Allow %q", tc.method, tc.path, status, hdr.Get("Allow"), tc.allow)
			continue
		}
		if msg := errorMessage(t, body); !strings.Contains(msg, "use "+strings.ReplaceAll(tc.allow, ", ", " or ")) {
			t.Errorf("%s %s: message %q does not say what to use", tc.method, tc.path, msg)
		}
		status, _, hdr = ts.do(t, "OPTIONS", tc.path, "", nil)
		if status != http.StatusNoContent || hdr.Get("Allow") != tc.allow {
			t.Errorf("OPTIONS %s: %d, Allow %q", tc.path, status, hdr.Get("Allow"))
		}
	}
	for _, path := range []string{"/healthz", "/api/v1/workers", "/metrics", "/"} {
		if status, _, _ := ts.do(t, "HEAD", path, "", nil); status != http.StatusOK {
			t.Errorf("HEAD %s: %d", path, status)
		}
	}
}

// GET /api/v1/workers: filters, pages with an opaque cursor in ID order,
// and without parameters the whole list as before.
func TestWorkersFiltersAndPages(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0", "e1", "e2", "e3", "e4")
	b := connectAgent(t, ts, "gpu-b")
	b.snapshot("other", "e0", "e1")
	testutil.Eventually(t, "the workers", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 7 })
	ts.fleet.update("gpu-a/e3", func(w *view.Worker) {
		w.State = view.StateHeld
		w.Warnings = []view.Warning{{Code: wire.CodeDPPoolImbalance, Severity: wire.SeverityCritical}}
	})
	ts.fleet.update("gpu-b/e1", func(w *view.Worker) { w.State = view.StateHeld })

	list := func(query string) (view.Workers, []string, string) {
		t.Helper()
		status, body, _ := ts.do(t, "GET", "/api/v1/workers"+query, "", nil)
		var ws view.Workers
		if status != http.StatusOK || json.Unmarshal(body, &ws) != nil {
			t.Fatalf("%s: %d %s", query, status, body)
		}
		var ids []string
		for _, w := range ws.Workers {
			ids = append(ids, w.ID)
		}
		return ws, ids, string(body)
	}
	all := []string{"gpu-a/e0", "gpu-a/e1", "gpu-a/e2", "gpu-a/e3", "gpu-a/e4", "gpu-b/e0", "gpu-b/e1"}
	if _, ids, body := list(""); !slices.Equal(ids, all) || strings.Contains(body, "next_cursor") {
		t.Errorf("no parameters: %v %s", ids, body)
	}
	for query, want := range map[string][]string{
		"?model=other":                        {"gpu-b/e0", "gpu-b/e1"},
		"?node=gpu-a&state=held":              {"gpu-a/e3"},
		"?state=held":                         {"gpu-a/e3", "gpu-b/e1"},
		"?warning=dp_pool_imbalance":          {"gpu-a/e3"},
		"?model=m&warning=gpu_clock_low":      nil,
		"?node=gpu-c":                         nil,
		"?cursor=" + encodeCursor("gpu-a/e4"): {"gpu-b/e0", "gpu-b/e1"},
	} {
		if _, ids, _ := list(query); !slices.Equal(ids, want) {
			t.Errorf("%s: %v, want %v", query, ids, want)
		}
	}

	// Pages of 3; a worker that arrives meanwhile does not disturb them.
	var seen []string
	query := "?limit=3"
	for page := 0; ; page++ {
		ws, ids, _ := list(query)
		seen = append(seen, ids...)
		if page == 0 {
			c := connectAgent(t, ts, "gpu-0")
			c.snapshot("m", "e0") // sorts before the cursor
			testutil.Eventually(t, "the new worker", 10*time.Second, func() bool { _, ok := ts.fleet.Worker("gpu-0/e0"); return ok })
		}
		if ws.NextCursor == "" {
			break
		}
		if page > 5 || len(ids) != 3 {
			t.Fatalf("page %d: %v, cursor %q", page, ids, ws.NextCursor)
		}
		query = "?limit=3&cursor=" + url.QueryEscape(ws.NextCursor)
	}
	if !slices.Equal(seen, all) {
		t.Errorf("paged %v, want %v", seen, all)
	}
	if _, ids, _ := list("?limit=1000&model=m"); len(ids) != 6 {
		t.Errorf("limit=1000: %v", ids)
	}

	for query, want := range map[string]string{
		"?limit=0":             "from 1 to 1000",
		"?limit=1001":          "from 1 to 1000",
		"?limit=ten":           "from 1 to 1000",
		"?cursor=bm90LW91cnM":  "not one this API gave",
		"?cursor=%21%21":       "not one this API gave",
		"?state=broken":        "use one of pending, measuring, admitted, stale, held, offline",
		"?warning=dp_pool":     "not a warning code: use one of dp_pool_imbalance",
		"?modle=m":             `unknown parameter "modle"`,
		"?model=":              `parameter "model" is empty`,
		"?model=m&model=other": `"model" is given 2 times`,
	} {
		status, body, _ := ts.do(t, "GET", "/api/v1/workers"+query, "", nil)
		if status != http.StatusBadRequest || !strings.Contains(errorMessage(t, body), want) {
			t.Errorf("%s: %d %s, want 400 with %q", query, status, body, want)
		}
	}
}
