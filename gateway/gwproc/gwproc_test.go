package gwproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fakeTB records what Require did; like testing.T, Fatalf and Skipf end
// the goroutine that calls them.
type fakeTB struct{ fatal, skip string }

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, a ...any) {
	f.fatal = fmt.Sprintf(format, a...)
	runtime.Goexit()
}
func (f *fakeTB) Skipf(format string, a ...any) {
	f.skip = fmt.Sprintf(format, a...)
	runtime.Goexit()
}

// require runs Require on its own goroutine, as a test would.
func require(tb *fakeTB, name string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		Require(tb, name)
	}()
	<-done
}

func TestRequireMissing(t *testing.T) {
	const name = "heft-no-such-gateway"
	if _, err := Find(name); err == nil || !strings.Contains(err.Error(), "apt-get install") {
		t.Fatalf("Find(%s): %v", name, err)
	}
	t.Setenv(RequireEnv, "")
	var tb fakeTB
	require(&tb, name)
	if tb.skip == "" || tb.fatal != "" || !strings.Contains(tb.skip, RequireEnv+"=1") {
		t.Errorf("without %s: skip %q, fatal %q", RequireEnv, tb.skip, tb.fatal)
	}
	t.Setenv(RequireEnv, "1")
	tb = fakeTB{}
	require(&tb, name)
	if tb.fatal == "" || tb.skip != "" {
		t.Errorf("with %s: skip %q, fatal %q", RequireEnv, tb.skip, tb.fatal)
	}
}

// The configurations are what the real gateways accept.
func TestConfigsCheck(t *testing.T) {
	nginx := Require(t, "nginx")
	haproxy := Require(t, "haproxy")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nginx.conf")
	body := "    server { listen 127.0.0.1:9; location / { return 204; } }"
	if err := os.WriteFile(conf, []byte(NginxConf(dir, body)), 0o644); err != nil {
		t.Fatal(err)
	}
	check := NginxCheck(nginx, dir, conf)
	if out, err := exec.Command(check[0], check[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", check, err, out)
	}

	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte("defaults\n    mode http\n    timeout client 1s\n    timeout server 1s\n    timeout connect 1s\n"+
		"frontend f\n    bind 127.0.0.1:9\n    default_backend b\nbackend b\n    server s 127.0.0.1:9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckHAProxy(context.Background(), haproxy, cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte("backend b\n    balance nonsense\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckHAProxy(context.Background(), haproxy, cfg); err == nil || !strings.Contains(err.Error(), "balance only supports") {
		t.Errorf("a bad config: %v, want haproxy's complaint", err)
	}
}
