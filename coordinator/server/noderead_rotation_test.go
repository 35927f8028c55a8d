package server

import (
	"net/http"
	"testing"
)

// TestNodeReadsTakeEveryTokenOfARotation: during a rotation a token file
// holds the old and the new token, one a line. The node records and the
// audit took the viewer and admin settings whole, so every admin token,
// old or new, read 401 there while /api/v1/workers took them.
func TestNodeReadsTakeEveryTokenOfARotation(t *testing.T) {
	const oldAdmin, oldViewer = "old-admin-token-for-tests-0123456789ab", "old-viewer-token-for-tests-0123456789a"
	opts := testOptions()
	opts.Tokens.Admin = oldAdmin + "\n" + adminToken
	opts.Tokens.Viewer = oldViewer + "\n" + viewerToken
	ts := startServer(t, opts, nil)
	for _, path := range []string{"/api/v1/workers", "/api/v1/nodes", "/api/v1/audit"} {
		for _, tok := range []string{oldAdmin, adminToken, oldViewer, viewerToken} {
			req, err := http.NewRequest(http.MethodGet, ts.base+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s with token %s: %d, want 200", path, tokenName(tok), resp.StatusCode)
			}
		}
		resp, err := http.Get(ts.base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with no token: %d, want 401", path, resp.StatusCode)
		}
	}
}
