package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/view"
)

// below_floor comes in the query or the body, must be a boolean, and both
// must agree; a hold without it is a plain hold.
func TestHoldBelowFloorFlag(t *testing.T) {
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 1 })

	for _, tc := range []struct {
		name, path, body string
		status           int
		below            bool
		errText          string
	}{
		{"query", "/api/v1/nodes/gpu-a/hold?below_floor=true", "", 200, true, ""},
		{"plain", "/api/v1/nodes/gpu-a/hold", "", 200, false, ""},
		{"body", "/api/v1/workers/gpu-a/e0/hold", `{"below_floor": true}`, 200, true, ""},
		{"false in the body", "/api/v1/workers/gpu-a/e0/hold", `{"below_floor": false}`, 200, false, ""},
		{"both agree", "/api/v1/workers/gpu-a/e0/hold?below_floor=1", `{"below_floor": true}`, 200, true, ""},
		{"both disagree", "/api/v1/workers/gpu-a/e0/hold?below_floor=false", `{"below_floor": true}`, 400, true, "disagree"},
		{"not a boolean", "/api/v1/nodes/gpu-a/hold?below_floor=yes-please", "", 400, true, `below_floor="yes-please" is not true or false`},
		{"empty", "/api/v1/nodes/gpu-a/hold?below_floor=", "", 400, true, "given once, with a value"},
		{"unknown field", "/api/v1/workers/gpu-a/e0/hold", `{"below": true}`, 400, true, `{"below_floor": true|false}`},
		{"not on admit", "/api/v1/nodes/gpu-a/admit?below_floor=true", "", 400, true, `unknown parameter "below_floor"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, data, _ := ts.do(t, "POST", tc.path, adminToken, strings.NewReader(tc.body))
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, data, tc.status)
			}
			if tc.status != 200 {
				if msg := errorMessage(t, data); !strings.Contains(msg, tc.errText) {
					t.Errorf("error %q, want it to say %q", msg, tc.errText)
				}
				// A refused request changes nothing: the last hold stands.
				if w, _ := ts.fleet.Worker("gpu-a/e0"); !w.BelowFloor {
					t.Errorf("a refused request changed the hold: %+v", w)
				}
				return
			}
			var w view.Worker
			if err := json.Unmarshal(data, &w); err != nil || w.State != view.StateHeld || w.AdminDecision != "hold" || w.BelowFloor != tc.below {
				t.Errorf("got %s, want held, below_floor %t", data, tc.below)
			}
		})
	}
}
