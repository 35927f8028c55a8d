package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"heft/coordinator/audit"
	"heft/coordinator/nodes"
	"heft/shared/testutil"
)

// auditAll reads every entry of GET /api/v1/audit, page by page.
func auditAll(t *testing.T, ts *testServer, limit int) []audit.Entry {
	t.Helper()
	var all []audit.Entry
	cursor := ""
	for pages := 0; ; pages++ {
		path := fmt.Sprintf("/api/v1/audit?limit=%d", limit)
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		status, body, _ := ts.do(t, "GET", path, adminToken, nil)
		var page auditPage
		if err := json.Unmarshal(body, &page); status != http.StatusOK || err != nil {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		if len(page.Entries) > limit {
			t.Fatalf("%s: %d entries", path, len(page.Entries))
		}
		all = append(all, page.Entries...)
		if page.NextCursor == "" || pages > 100 {
			return all
		}
		cursor = page.NextCursor
	}
}

// Twenty pending nodes are approved in one call by name pattern; an
// address range and "all" select the same way; each approval and each
// other admin action is an audit entry with the token kind, the source
// address, and the value before and after.
func TestBulkApproveAndAudit(t *testing.T) {
	opts := testOptions()
	cfg := nodes.DefaultConfig()
	cfg.ApproveNew = true
	opts.Nodes = registry(t, cfg)
	ts := startServer(t, opts, nil)

	names := []string{"db-1"}
	for i := range 20 {
		names = append(names, fmt.Sprintf("gpu-%02d", i))
	}
	creds := map[string]string{}
	for _, n := range names {
		_, w := hello(t, ts, n, "", true)
		if w == nil {
			t.Fatalf("%s was not handed a credential", n)
		}
		creds[n] = w.NodeCredential
	}
	testutil.Eventually(t, "21 pending nodes", 10*time.Second, func() bool { return opts.Nodes.Counts()[nodes.StatePending] == 21 })

	approve := func(body string) (int, approveAnswer, string) {
		t.Helper()
		status, data, _ := ts.do(t, "POST", "/api/v1/nodes/approve", adminToken, strings.NewReader(body))
		var a approveAnswer
		_ = json.Unmarshal(data, &a)
		return status, a, string(data)
	}
	for body, want := range map[string]string{
		`{}`:                             `both, or`,
		`{"all": true, "name": "gpu-*"}`: `give it alone`,
		`{"name": "gpu-["}`:              `syntax error in pattern`,
		`{"address": "10.0.0.300/8"}`:    `neither a prefix`,
		`{"nmae": "gpu-*"}`:              `unknown field`,
	} {
		if status, _, data := approve(body); status != http.StatusBadRequest || !strings.Contains(data, want) {
			t.Errorf("%s: %d %s, want 400 saying %q", body, status, data, want)
		}
	}
	if status, _, _ := ts.do(t, "POST", "/api/v1/nodes/approve", "", strings.NewReader(`{"all": true}`)); status != http.StatusUnauthorized {
		t.Errorf("bulk approve without the admin token: %d", status)
	}
	if opts.Nodes.Counts()[nodes.StatePending] != 21 {
		t.Fatal("a refused request approved nodes")
	}

	if status, a, data := approve(`{"address": "10.0.0.0/8"}`); status != http.StatusOK || len(a.Approved) != 0 {
		t.Errorf("no node connected from 10/8: %d %s", status, data)
	}
	status, a, data := approve(`{"name": "gpu-*", "address": "127.0.0.0/8"}`)
	if status != http.StatusOK || len(a.Approved) != 20 || len(a.Failed) != 0 {
		t.Fatalf("approve gpu-* from 127/8: %d %s", status, data)
	}
	for _, n := range a.Approved {
		if !strings.HasPrefix(n.Name, "gpu-") || n.State != nodes.StateEnrolled {
			t.Errorf("approved %+v", n)
		}
	}
	if rec, _ := opts.Nodes.Get("db-1"); rec.State != nodes.StatePending {
		t.Errorf("db-1 is %s, want still pending", rec.State)
	}
	if status, a, data := approve(`{"all": true}`); status != http.StatusOK || len(a.Approved) != 1 || a.Approved[0].Name != "db-1" {
		t.Errorf("approve all: %d %s", status, data)
	}

	// A worker action and a release are audited too.
	ag, w := hello(t, ts, "gpu-00", creds["gpu-00"], true)
	if w == nil {
		t.Fatal("the approved gpu-00 was refused")
	}
	ag.snapshot("m", "e0")
	testutil.Eventually(t, "the worker", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 1 })
	if status, body, _ := ts.do(t, "POST", "/api/v1/workers/gpu-00/e0/pin", adminToken, strings.NewReader(`{"weight": 1.5}`)); status != http.StatusOK {
		t.Fatalf("pin: %d %s", status, body)
	}
	if status, _, _ := ts.do(t, "DELETE", "/api/v1/nodes/gpu-19", adminToken, nil); status != http.StatusNoContent {
		t.Fatalf("release: %d", status)
	}

	es := auditAll(t, ts, 7)
	if len(es) != 23 {
		t.Fatalf("%d audit entries, want 21 approvals, a pin and a release", len(es))
	}
	for i, e := range es {
		if e.Seq != uint64(23-i) || e.Token != "admin" || e.Source != "127.0.0.1" || e.Time.IsZero() {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	if e := es[0]; e.Action != "release" || e.Target != "gpu-19" || e.Old != nodes.StateEnrolled || e.New != "released" {
		t.Errorf("newest entry %+v, want the release of gpu-19", e)
	}
	if e := es[1]; e.Action != "pin" || e.Target != "gpu-00/e0" || e.Node != "gpu-00" || strings.Contains(e.Old, "pinned") || !strings.Contains(e.New, "pinned 1.5") {
		t.Errorf("pin entry %+v", e)
	}
	if e := es[2]; e.Action != "approve" || e.Target != "db-1" || e.Old != nodes.StatePending || e.New != nodes.StateEnrolled || e.Detail != "bulk approve: all pending" {
		t.Errorf("approve-all entry %+v", e)
	}
	if e := es[3]; e.Action != "approve" || !strings.HasPrefix(e.Target, "gpu-") || e.Detail != "bulk approve: name gpu-*, address 127.0.0.0/8" {
		t.Errorf("bulk entry %+v", e)
	}
	for _, bad := range []string{"?limit=0", "?limit=1001", "?cursor=x", "?cursor=0", "?page=2"} {
		if status, _, _ := ts.do(t, "GET", "/api/v1/audit"+bad, adminToken, nil); status != http.StatusBadRequest {
			t.Errorf("/api/v1/audit%s: %d, want 400", bad, status)
		}
	}
	if status, _, _ := ts.do(t, "GET", "/api/v1/audit", "", nil); status != http.StatusUnauthorized {
		t.Errorf("/api/v1/audit without a token (no viewer token set): %d, want 401 like the node records", status)
	}
}
