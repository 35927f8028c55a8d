package coordinator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"heft/coordinator/audit"
	"heft/shared/testutil"
	"heft/shared/view"
)

// An admin's hold below the floor is stored with the decision: the API
// shows it, the audit names it, and a coordinator restarted on the same
// state still shows it, so heft-sync goes on letting the worker go.
func TestHoldBelowFloorSurvivesRestart(t *testing.T) {
	cfg := testConfig(t)
	r := start(t, cfg)
	a, key := oneEngine(t, r)
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool {
		status, _ := r.do(t, "GET", "/api/v1/workers/"+key, "", "")
		return status == http.StatusOK
	})

	status, body := r.do(t, "POST", "/api/v1/nodes/gpu-a/hold?below_floor=true", adminToken, "")
	var w view.Worker
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.State != view.StateHeld || w.AdminDecision != "hold" || !w.BelowFloor {
		t.Fatalf("hold below the floor: %d %s", status, body)
	}
	status, body = r.do(t, "GET", "/api/v1/audit", adminToken, "")
	var page struct{ Entries []audit.Entry }
	if status != http.StatusOK || json.Unmarshal(body, &page) != nil || len(page.Entries) == 0 ||
		page.Entries[0].Action != "hold below floor" || !strings.Contains(page.Entries[0].New, "below floor") {
		t.Errorf("audit: %d %s", status, body)
	}

	_ = a.c.CloseNow()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	status, body = r2.do(t, "GET", "/api/v1/workers/"+key, "", "")
	w = view.Worker{}
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.State != view.StateHeld || w.AdminDecision != "hold" || !w.BelowFloor {
		t.Fatalf("after a restart: %d %s", status, body)
	}
	// A plain hold states the floor anew: it applies again.
	status, body = r2.do(t, "POST", "/api/v1/workers/"+key+"/hold", adminToken, "")
	w = view.Worker{}
	if status != http.StatusOK || json.Unmarshal(body, &w) != nil || w.State != view.StateHeld || w.BelowFloor {
		t.Errorf("plain hold after a hold below the floor: %d %s", status, body)
	}
}
