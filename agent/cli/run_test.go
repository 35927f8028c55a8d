package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

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

// runFakeCoordinator accepts one agent at a time and hands its decoded
// messages to the test.
type runFakeCoordinator struct {
	srv   *httptest.Server
	conns chan *runFakeConn
}

type runFakeConn struct {
	c    *websocket.Conn
	msgs chan *wire.Envelope
	done chan struct{}
	err  error
}

func newRunFakeCoordinator(t *testing.T) *runFakeCoordinator {
	f := &runFakeCoordinator{conns: make(chan *runFakeConn, 10)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/agent" || r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.SetReadLimit(wire.MaxMessageBytes)
		fc := &runFakeConn{c: c, msgs: make(chan *wire.Envelope, 1000), done: make(chan struct{})}
		f.conns <- fc
		defer close(fc.done)
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				fc.err = err
				return
			}
			env, err := wire.Decode(data)
			if err != nil {
				t.Errorf("agent sent an invalid message: %v", err)
				fc.err = err
				return
			}
			select {
			case fc.msgs <- env:
			default: // the test stopped listening; heartbeats may pile up
			}
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (fc *runFakeConn) next(t *testing.T, typ string) *wire.Envelope {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case env := <-fc.msgs:
			if env.Type == typ {
				return env
			}
		case <-fc.done:
			t.Fatalf("connection ended while waiting for %s: %v", typ, fc.err)
		case <-deadline:
			t.Fatalf("no %s from the agent", typ)
		}
	}
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
	coord := newRunFakeCoordinator(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errOut := &testutil.SyncBuffer{}
	exit := make(chan int, 1)
	go func() {
		exit <- runAgent(ctx, []string{
			"--coordinator", "ws" + strings.TrimPrefix(coord.srv.URL, "http") + "/api/v1/agent",
			"--token-file", runTokenFile(t, 0o600),
			"--node", "gpu-test",
			"--engine", "vllm=" + engine.URL(),
			"--probe-concurrency", "4", "--probe-tokens", "16",
			"--snapshot-interval", "50ms", "--poll-interval", "20ms",
			"--log-level", "debug",
		}, runNoEnv, IO{Out: &out, Err: errOut})
	}()
	defer func() {
		if t.Failed() {
			t.Logf("agent stderr:\n%s", errOut.String())
		}
	}()

	var fc *runFakeConn
	select {
	case fc = <-coord.conns:
	case code := <-exit:
		t.Fatalf("agent exited %d before connecting", code)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not connect")
	}
	hello := fc.next(t, wire.TypeHello).Hello
	if hello.Node != "gpu-test" || hello.Host.OS == "" {
		t.Errorf("hello = %+v", hello)
	}
	// Heartbeats come every 50ms; wait for one where the engine is known.
	var eng wire.Engine
	for eng.CapacityKey == "" || !eng.Ready {
		snap := fc.next(t, wire.TypeSnapshot).Snapshot
		if snap.Node != "gpu-test" || len(snap.Engines) != 1 {
			t.Fatalf("snapshot = %+v", snap)
		}
		eng = snap.Engines[0]
	}
	if eng.Kind != "vllm" || eng.Model != "test/model" {
		t.Errorf("engine = %+v", eng)
	}

	runSend(t, fc, &wire.ProbeRequest{RequestID: "r1", CapacityKey: eng.CapacityKey, Reason: wire.ReasonOnDemand})
	if st := fc.next(t, wire.TypeProbeStatus).ProbeStatus; st.State != wire.ProbeRunning || st.RequestID != "r1" {
		t.Fatalf("status = %+v, want running", st)
	}
	res := fc.next(t, wire.TypeProbeResult).ProbeResult
	m := res.Measurement
	if res.RequestID != "r1" || m.CapacityKey != eng.CapacityKey || !m.Valid() || m.Trigger != wire.ReasonOnDemand {
		t.Fatalf("result = %+v", res)
	}
	if m.Concurrency != 4 || m.TokensPerReq != 16 || m.OutputTokens != 64 {
		t.Errorf("burst shape = %d×%d → %d tokens, want 4×16 → 64", m.Concurrency, m.TokensPerReq, m.OutputTokens)
	}

	// An unknown capacity key fails cleanly.
	runSend(t, fc, &wire.ProbeRequest{RequestID: "r2", CapacityKey: "gpu-test/none", Reason: wire.ReasonScheduled})
	for {
		st := fc.next(t, wire.TypeProbeStatus).ProbeStatus
		if st.RequestID == "r2" && st.State == wire.ProbeFailed {
			break
		}
	}

	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d after cancel, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not stop")
	}
	<-fc.done
	if code := websocket.CloseStatus(fc.err); code != websocket.StatusGoingAway {
		t.Errorf("close code %v, want going away", code)
	}
}

func runSend(t *testing.T, fc *runFakeConn, payload any) {
	t.Helper()
	data, err := wire.Encode(payload)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fc.c.Write(wctx, websocket.MessageText, data); err != nil {
		t.Fatal(err)
	}
}

// TestRunPlainTextWarning starts the agent already stopped, so nothing is
// dialled; the coordinator address is in TEST-NET-1, routed nowhere anyway.
func TestRunPlainTextWarning(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	errOut := &testutil.SyncBuffer{}
	code := runAgent(ctx, []string{"--coordinator", "ws://192.0.2.1:7070/api/v1/agent",
		"--token-file", runTokenFile(t, 0o600), "--node", "gpu-test"}, runNoEnv, IO{Out: &out, Err: errOut})
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "WARNING: the agent token is sent in plain text to 192.0.2.1:7070") {
		t.Errorf("no plain-text warning:\n%s", errOut.String())
	}
}
