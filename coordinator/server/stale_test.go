package server

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"heft/shared/view"
)

// offlineLine is the offline worker's server line: its check options, then
// disabled.
var offlineLine = regexp.MustCompile(`(?m)^\s*server \S+ 10\.0\.0\.2:8000 weight 1 maxconn 16 (check [^#]*)?disabled\s`)

// A stale worker (its agent gone, its engine not known to be) is routed
// at its last weight: the HAProxy rendering serves it and the agent check
// answers ready; an offline one is disabled and drained.
func TestStaleWorkerServes(t *testing.T) {
	ts := formatsFleet(t)
	ts.fleet.update("gpu-a/slow", func(w *view.Worker) { w.State = view.StateStale })
	status, body, _ := ts.do(t, "GET", weightsPath+"?format=haproxy", "", nil)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	if text := string(body); !strings.Contains(text, "2 of 3 workers serve") ||
		!strings.Contains(text, "server heft-10.0.0.2-8000 10.0.0.2:8000 weight 63 maxconn 16 ") {
		t.Errorf("the stale worker is not served at its weight:\n%s", text)
	}
	answers := ts.agentAnswers()["Qwen/Qwen3-8B"]
	if got := answers["10.0.0.2:8000"]; !strings.HasPrefix(got, "ready ") {
		t.Errorf("agent check for the stale worker: %q, want ready", got)
	}

	ts.fleet.update("gpu-a/slow", func(w *view.Worker) { w.State, w.Weight = view.StateOffline, nil })
	_, body, _ = ts.do(t, "GET", weightsPath+"?format=haproxy", "", nil)
	if text := string(body); !strings.Contains(text, "1 of 3 workers serve") || !offlineLine.MatchString(text) {
		t.Errorf("the offline worker is served:\n%s", text)
	}
	if got := ts.agentAnswers()["Qwen/Qwen3-8B"]["10.0.0.2:8000"]; got != "drain" {
		t.Errorf("agent check for the offline worker: %q, want drain", got)
	}
}
