package server

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

type fakeState struct {
	data string
	fail error
}

func (f fakeState) Backup(w io.Writer, size func(int64)) (int64, error) {
	if f.fail != nil {
		return 0, f.fail
	}
	size(int64(len(f.data)))
	n, err := io.WriteString(w, f.data)
	return int64(n), err
}

// GET /api/v1/backup is the admin's alone; it streams the state with its
// length, and a failure before the first byte is a JSON error.
func TestBackupRoute(t *testing.T) {
	opts := testOptions()
	opts.State = fakeState{data: "state bytes"}
	ts := startServer(t, opts, nil)
	for _, tok := range []string{"", "viewer-token-0123456789abcdef0123", "wrong"} {
		if code, _, _ := ts.do(t, http.MethodGet, "/api/v1/backup", tok, nil); code != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, code)
		}
	}
	code, body, h := ts.do(t, http.MethodGet, "/api/v1/backup", opts.Tokens.Admin, nil)
	if code != http.StatusOK || string(body) != "state bytes" || h.Get("Content-Length") != "11" || h.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("backup: %d %q %v", code, body, h)
	}
	if code, _, h := ts.do(t, http.MethodPost, "/api/v1/backup", opts.Tokens.Admin, strings.NewReader("{}")); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d %v", code, h)
	}

	opts.State = fakeState{fail: errors.New("disk gone")}
	ts = startServer(t, opts, nil)
	code, body, _ = ts.do(t, http.MethodGet, "/api/v1/backup", opts.Tokens.Admin, nil)
	if code != http.StatusInternalServerError || !strings.Contains(errorMessage(t, body), "disk gone") {
		t.Errorf("failed backup: %d %s", code, body)
	}
	opts.State = nil
	ts = startServer(t, opts, nil)
	if code, _, _ := ts.do(t, http.MethodGet, "/api/v1/backup", opts.Tokens.Admin, nil); code != http.StatusNotImplemented {
		t.Errorf("no state: %d", code)
	}
}
