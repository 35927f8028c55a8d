package app_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
)

// The viewer token rotated mid-run (the coordinator takes only the new
// one, heft-sync's token_file holds it): heft-sync reads its file again at
// the first refusal and follows the fleet on, with no restart. Before, it
// kept presenting the token it started with, and the gateway froze at its
// last state until someone restarted heft-sync.
func TestTokenRotationMidRun(t *testing.T) {
	a, b := gwtest.NewUpstream(t, "a"), gwtest.NewUpstream(t, "b")
	hx := gwtest.StartHAProxy(t, haproxyCfg)
	c := gwtest.NewCoordinator(t)
	c.SetToken("viewer-token-one")
	c.SetWorkers(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1))
	tokenFile := filepath.Join(t.TempDir(), "viewer.token")
	if err := os.WriteFile(tokenFile, []byte("viewer-token-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runSync(t, c.URL(), fmt.Sprintf("token_file = %q\n[[haproxy]]\nmodel = %q\nsocket = %q\nbackend = \"qwen\"\n", tokenFile, model, hx.Socket))
	testutil.Eventually(t, "both workers served", 10*time.Second, func() bool {
		s := gwtest.Split(t, "http://"+hx.Front+"/", 4)
		return s["a"] == 2 && s["b"] == 2
	})

	if err := os.WriteFile(tokenFile, []byte("viewer-token-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.SetToken("viewer-token-two")
	c.Stop() // the open stream ends, as a coordinator restarted in a rotation ends it
	c.Start()
	c.SetWorkers(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateHeld, 1))
	testutil.Eventually(t, "the held worker drained after the rotation", 10*time.Second, func() bool {
		return gwtest.Split(t, "http://"+hx.Front+"/", 4)["a"] == 4
	})
}
