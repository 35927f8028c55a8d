package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/agent/internal/fakecoord"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

func runNoEnv(string) string { return "" }

func runTokenFile(t *testing.T, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(p, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"every problem listed", []string{"--node", " ", "--engine", "no-such-engine=http://127.0.0.1:8000", "--log-level", "loud"}, 78,
			[]string{"no coordinator URL", "no agent token", "no node name", `unknown kind "no-such-engine"`, `log level "loud"`}},
		{"token file open to others", []string{"--coordinator", "ws://127.0.0.1:1/api/v1/agent",
			"--token-file", runTokenFile(t, 0o644)}, 78, []string{"chmod 600"}},
		{"unknown key in file", []string{"--config", writeRunConfig(t, "[coordinator]\nurl = \"ws://127.0.0.1:1\"\ntokn = \"x\"\n")}, 78,
			[]string{"coordinator.tokn"}},
		{"missing file", []string{"--config", filepath.Join(t.TempDir(), "nope.toml")}, 78, []string{"nope.toml"}},
		{"bare-number duration", []string{"--config", writeRunConfig(t, "poll_interval = 2\n")}, 78,
			[]string{`write poll_interval = "2s"`}},
		{"bad flag", []string{"--bogus"}, 2, []string{"bogus", "usage: heft-agent run"}},
		{"stray argument", []string{"now"}, 2, []string{`unexpected argument "now"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := runAgent(context.Background(), tc.args, runNoEnv, IO{Out: &out, Err: &errOut})
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr does not mention %q:\n%s", w, errOut.String())
				}
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := runAgent(context.Background(), []string{"-h"}, runNoEnv, IO{Out: &out, Err: &errOut}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, w := range []string{"usage: heft-agent run", "-coordinator", "-token-file", "-engine"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help does not mention %q:\n%s", w, out.String())
		}
	}
}

func writeRunConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunAgainstFakeCoordinator runs the whole agent in-process against a
// simulated vLLM engine and a fake coordinator: hello, snapshot, a probe on
// request, and a clean stop.
func TestRunAgainstFakeCoordinator(t *testing.T) {
	engine, err := sim.Start(sim.Config{Flavor: "vllm", Model: "test/model", SingleTPS: 100, Batch16TPS: 800}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	coord := fakecoord.Start(t, "s3cret")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errOut := &testutil.SyncBuffer{}
	exit := make(chan int, 1)
	go func() {
		exit <- runAgent(ctx, []string{
			"--coordinator", coord.URL, "--state-dir", t.TempDir(),
			"--token-file", runTokenFile(t, 0o600),
			"--node", "gpu-test",
			"--engine", "vllm=" + engine.URL(),
			"--probe-concurrency", "4", "--probe-tokens", "16",
			"--snapshot-interval", "50ms", "--poll-interval", "100ms",
			"--log-level", "debug",
		}, runNoEnv, IO{Out: &out, Err: errOut})
	}()
	defer func() {
		if t.Failed() {
			t.Logf("agent stderr:\n%s", errOut.String())
		}
	}()

	fc := awaitConn(t, coord, exit)
	hello := fc.Next(t, wire.TypeHello).Hello
	if hello.Node != "gpu-test" || hello.Host.OS == "" {
		t.Errorf("hello = %+v", hello)
	}
	// Heartbeats come every 50ms; wait for one where the engine is known.
	var eng wire.Engine
	for eng.CapacityKey == "" || !eng.Ready {
		snap := fc.Next(t, wire.TypeSnapshot).Snapshot
		if snap.Node != "gpu-test" || len(snap.Engines) != 1 {
			t.Fatalf("snapshot = %+v", snap)
		}
		eng = snap.Engines[0]
	}
	if eng.Kind != "vllm" || eng.Model != "test/model" {
		t.Errorf("engine = %+v", eng)
	}

	fc.Send(t, &wire.ProbeRequest{RequestID: "r1", CapacityKey: eng.CapacityKey, Reason: wire.ReasonOnDemand})
	if st := fc.Next(t, wire.TypeProbeStatus).ProbeStatus; st.State != wire.ProbeRunning || st.RequestID != "r1" {
		t.Fatalf("status = %+v, want running", st)
	}
	res := fc.Next(t, wire.TypeProbeResult).ProbeResult
	m := res.Measurement
	if res.RequestID != "r1" || m.CapacityKey != eng.CapacityKey || !m.Valid() || m.Trigger != wire.ReasonOnDemand {
		t.Fatalf("result = %+v", res)
	}
	if m.Concurrency != 4 || m.TokensPerReq != 16 || m.OutputTokens != 64 {
		t.Errorf("burst shape = %d×%d → %d tokens, want 4×16 → 64", m.Concurrency, m.TokensPerReq, m.OutputTokens)
	}

	// An unknown capacity key fails cleanly.
	fc.Send(t, &wire.ProbeRequest{RequestID: "r2", CapacityKey: "gpu-test/none", Reason: wire.ReasonScheduled})
	for {
		st := fc.Next(t, wire.TypeProbeStatus).ProbeStatus
		if st.RequestID == "r2" && st.State == wire.ProbeFailed {
			break
		}
	}

	stopAgent(t, cancel, exit)
	if code := fc.CloseStatus(t); code != websocket.StatusGoingAway {
		t.Errorf("close code %v, want going away", code)
	}
}

// TestRunPlainTextWarning starts the agent already stopped, so nothing is
// dialled; the coordinator address is in TEST-NET-1, routed nowhere anyway.
func TestRunPlainTextWarning(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	errOut := &testutil.SyncBuffer{}
	code := runAgent(ctx, []string{"--coordinator", "ws://192.0.2.1:7070/api/v1/agent", "--state-dir", t.TempDir(),
		"--token-file", runTokenFile(t, 0o600), "--node", "gpu-test"}, runNoEnv, IO{Out: &out, Err: errOut})
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "WARNING: the agent token is sent in plain text to 192.0.2.1:7070") {
		t.Errorf("no plain-text warning:\n%s", errOut.String())
	}
}

// awaitConn waits for the agent's next connection to the fake
// coordinator, failing if the agent exits first.
func awaitConn(t *testing.T, coord *fakecoord.Coordinator, exit <-chan int) *fakecoord.Conn {
	t.Helper()
	select {
	case fc := <-coord.Conns:
		return fc
	case code := <-exit:
		t.Fatalf("agent exited %d before connecting", code)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	return nil
}

// stopAgent cancels the agent's context and wants it to exit 0.
func stopAgent(t *testing.T, cancel context.CancelFunc, exit <-chan int) {
	t.Helper()
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d after cancel, want 0", code)
		}
	case <-time.After(time.Minute): // a deadline, not a speed: under test-under-load a stop can take long
		t.Fatal("agent did not stop")
	}
}
