package engine

import (
	"net/http"
	"sync/atomic"
	"testing"
)

// SGLang's /metrics gauges are written every 40 decode steps and, once
// idle, every 30 s; /v1/loads and the older /get_load read the scheduler
// when asked. The fixture's gauges show 9 running and 6 waiting; the live
// endpoints here say the engine is idle, and win. An endpoint that is
// not served, or refused for want of the key (SGLang's --api-key covers
// them but not /metrics), is asked once, not on every read.
func TestSGLangLoadIsLive(t *testing.T) {
	const idleLoads = `{"loads":[{"dp_rank":0,"num_running_reqs":0,"num_waiting_reqs":0,"token_usage":0.01,"max_total_num_tokens":24094},` +
		`{"dp_rank":1,"num_running_reqs":0,"num_waiting_reqs":0,"token_usage":0.02,"max_total_num_tokens":2925}]}`
	const idleGetLoad = `[{"dp_rank":0,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0},{"dp_rank":1,"num_reqs":0,"num_waiting_reqs":0,"num_tokens":0}]`
	serve := func(body string, hits *atomic.Int32) http.HandlerFunc {
		switch body {
		case "":
			return func(w http.ResponseWriter, r *http.Request) { hits.Add(1); http.NotFound(w, r) }
		case "401":
			return func(w http.ResponseWriter, _ *http.Request) {
				hits.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error": "Unauthorized"}`))
			}
		}
		return func(w http.ResponseWriter, _ *http.Request) {
			hits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(body))
		}
	}
	for _, tc := range []struct {
		name                 string
		loads, getLoad       string // "" = not served, "401" = refused
		running, waiting     int
		loadsHits, otherHits int32 // over three Load calls and one Facts
	}{
		{"/v1/loads", idleLoads, idleGetLoad, 0, 0, 4, 0},
		{"older: /get_load", "", idleGetLoad, 0, 0, 1, 4},
		{"oldest: the gauges", "", "", 9, 6, 1, 1},
		{"--api-key: the gauges", "401", "401", 9, 6, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var loadsHits, getLoadHits atomic.Int32
			srv := startFake(t, "sglang", map[string]http.HandlerFunc{
				"/v1/loads": serve(tc.loads, &loadsHits), "/get_load": serve(tc.getLoad, &getLoadHits)})
			c := newClient(t, "sglang", srv.URL, nil)
			for i := range 3 {
				l, err := c.Load(t.Context())
				if err != nil || !l.Known || l.Running != tc.running || l.Waiting != tc.waiting || len(l.Ranks) != 2 {
					t.Fatalf("read %d: load %+v (%v), want %d running and %d waiting over 2 ranks", i, l, err, tc.running, tc.waiting)
				}
			}
			e := c.Facts(t.Context(), nil, nil)
			if e.Load.Running != tc.running || e.Load.Waiting != tc.waiting {
				t.Errorf("facts: load %+v, want %d running, %d waiting", e.Load, tc.running, tc.waiting)
			}
			// /get_load has no token usage: the gauges' stands in.
			if tc.name == "older: /get_load" && (e.Load.Ranks[1].KVUsage < 0.9 || e.Load.KVUsage != e.Load.Ranks[1].KVUsage) {
				t.Errorf("facts: KV usage %+v, want the gauges' (rank 1 over 0.9)", e.Load)
			}
			if got := loadsHits.Load(); got != tc.loadsHits {
				t.Errorf("/v1/loads asked %d times, want %d", got, tc.loadsHits)
			}
			if got := getLoadHits.Load(); got != tc.otherHits {
				t.Errorf("/get_load asked %d times, want %d", got, tc.otherHits)
			}
		})
	}
}
