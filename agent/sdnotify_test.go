package agent

import (
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/config"
	"heft/agent/internal/fakecoord"
)

// notifySocket is a systemd-like notify socket; got receives each state
// the agent sends.
func notifySocket(t *testing.T) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 100)
	go func() {
		defer close(got)
		buf := make([]byte, 256)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		for range got { // the reader has ended
		}
	})
	return path, got
}

func next(t *testing.T, got <-chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("nothing on the notify socket")
		return ""
	}
}

// Under systemd (Type=notify, WatchdogSec=) the agent says it is ready
// and then feeds the watchdog.
func TestSystemdReadyAndWatchdog(t *testing.T) {
	path, got := notifySocket(t)
	coord := fakecoord.Start(t, token)
	cfg := config.Default()
	cfg.Coordinator.URL, cfg.Coordinator.Token, cfg.Node.Name = coord.URL, token, "n"
	cfg.StateDir = t.TempDir()
	vars := env{"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, nil, WithGPUs(oneGPU{}), withEnv(vars.get)) }()
	defer func() {
		cancel()
		<-done
	}()
	if s := next(t, got); s != "READY=1" {
		t.Fatalf("first state %q, want READY=1", s)
	}
	for range 3 {
		if s := next(t, got); s != "WATCHDOG=1" {
			t.Fatalf("state %q, want WATCHDOG=1", s)
		}
	}
}

// A stuck agent stops feeding the watchdog, so systemd restarts it.
func TestSystemdWatchdogStarvesWhileStuck(t *testing.T) {
	path, got := notifySocket(t)
	var calls atomic.Int64
	stuck := func() bool { return calls.Add(1) <= 3 }
	sd := systemdFromEnv(env{"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"}.get, hclog.NewNullLogger())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sd.run(ctx, stuck) }()
	defer func() { cancel(); <-done }()
	if s := next(t, got); s != "READY=1" {
		t.Fatalf("first state %q", s)
	}
	if s := next(t, got); s != "WATCHDOG=1" || calls.Load() <= 3 {
		t.Errorf("%q after %d checks: the watchdog was fed while the agent was stuck", s, calls.Load())
	}
}

func TestSystemdNotUnderSystemd(t *testing.T) {
	if sd := systemdFromEnv(env{}.get, nil); sd != nil {
		t.Errorf("without NOTIFY_SOCKET: %+v", sd)
	}
	sd := systemdFromEnv(env{"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}.get, nil)
	if sd == nil || sd.interval != 0 {
		t.Errorf("a watchdog meant for another process was taken: %+v", sd)
	}
}

type env map[string]string

func (e env) get(k string) string { return e[k] }
