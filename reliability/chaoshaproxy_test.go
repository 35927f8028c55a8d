package reliability

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/gateway/gwtest"
)

// The chaos test's HAProxy keeps an engine whose /health answers late
// (3 s, three times its inter 1s: an API server saturated by the chaos
// load answers it on the same event loop) and sends it requests: its
// "timeout check" gives the answer 5 s. Without it the whole check gets
// inter, the engine is marked DOWN at its first check, and the chaos
// test would count failures that no fault caused.
func TestChaosHAProxyWaitsForASlowHealthRoute(t *testing.T) {
	gwtest.RequireBinary(t, "haproxy")
	t.Parallel()
	u := gwtest.NewSlowHealthUpstream(t, "slow", 3*time.Second)
	hx := gwtest.StartHAProxy(t, strings.ReplaceAll(chaosHAProxy, "{{state}}", filepath.Join(t.TempDir(), "haproxy.state")))
	host, port, err := net.SplitHostPort(u.Addr)
	if err != nil {
		t.Fatal(err)
	}
	hx.Run("set server qwen/heft1 addr " + host + " port " + port)
	hx.Run("set server qwen/heft1 state ready")
	hx.WaitSlowChecksPass(t, "qwen", u, 2)
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 5); split["slow"] != 5 {
		t.Fatalf("requests through the backend: %v, want all 5 answered by the engine", split)
	}
}
