package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"heft/gateway/gwproc"
)

// After each reload from a placeholder (every server down) to a real
// upstream, one answer and then one generation of workers means every new
// connection is answered by the new configuration: what the bench relies on
// before it sends load.
func TestWaitNginxOneGeneration(t *testing.T) {
	nginx := gwproc.Require(t, "nginx")
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer engine.Close()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	front := fmt.Sprintf("http://127.0.0.1:%d/", port)
	upstream := filepath.Join(dir, "up.conf")
	placeholder := "upstream up { server 127.0.0.1:9 down; }\n"
	real := "upstream up { server " + engine.Listener.Addr().String() + "; }\n"
	if err := os.WriteFile(upstream, []byte(placeholder), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	body := fmt.Sprintf("    include %s;\n    server { listen 127.0.0.1:%d; location / { proxy_pass http://up; } }", upstream, port)
	if err := os.WriteFile(conf, []byte(gwproc.NginxConf(dir, body)), 0o600); err != nil {
		t.Fatal(err)
	}
	ch, err := startChild(dir, "nginx", nginx, gwproc.NginxArgs(dir, conf), childIO{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Stop(5 * time.Second)
	ctx := context.Background()
	if err := waitListening(ctx, ch, []string{fmt.Sprintf("tcp:127.0.0.1:%d", port)}); err != nil {
		t.Fatal(err)
	}

	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	status := func() int {
		resp, err := fresh.Get(front)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// switchTo writes text, reloads, waits for one answer of want and then
	// for one generation of workers.
	switchTo := func(text string, want int) {
		if err := os.WriteFile(upstream, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		reload := gwproc.NginxReload(nginx, dir, conf)
		if out, err := exec.Command(reload[0], reload[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", reload, err, out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("no %d within 10 s of the reload", want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := gwproc.WaitNginxOneGeneration(ctx, ch.Pid(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for cycle := range 5 {
		switchTo(real, http.StatusOK)
		for i := range 20 {
			if got := status(); got != http.StatusOK {
				log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
				t.Fatalf("cycle %d, request %d after the wait: %d, want 200 (an old worker served the placeholder); nginx's error log:\n%s", cycle, i, got, log)
			}
		}
		switchTo(placeholder, http.StatusBadGateway)
	}
}
