package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/discover"
	"heft/agent/gpu"
	"heft/agent/internal/fakecoord"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// simChild is the test binary run as a heft-sim: it reads heft-sim's
// flags that the test uses, serves the simulated engine on a free port,
// prints its URL on stdout as heft-sim does, and stops when its stdin
// closes.
func simChild(args []string) int {
	var cfg sim.Config
	fs := flag.NewFlagSet("heft-sim", flag.ContinueOnError)
	fs.StringVar(&cfg.Flavor, "flavor", sim.FlavorVLLM, "")
	fs.StringVar(&cfg.Model, "model", sim.DefaultModel, "")
	fs.Float64Var(&cfg.SingleTPS, "single-tps", 0, "")
	fs.Float64Var(&cfg.Batch16TPS, "batch16-tps", 0, "")
	fs.StringVar(&cfg.LogPath, "log", "", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	srv, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(srv.URL())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes our stdin
	_ = srv.Close()
	return 0
}

// startSim starts a heft-sim process (the test binary as simChild) whose
// stdout and stderr, the start-up log included, are appended to a file,
// as `heft-sim ... >>FILE 2>&1` would, and returns its pid, URL and log.
func startSim(t *testing.T, flavor, model string) (pid int, url, logPath string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath = filepath.Join(t.TempDir(), flavor+".log")
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := &exec.Cmd{Path: self, Args: []string{"heft-sim", "--flavor", flavor, "--model", model,
		"--single-tps", "100", "--batch16-tps", "800", "--log", "/dev/stdout"},
		Env: append(os.Environ(), simChildEnv+"=1"), Stdout: out, Stderr: out}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	testutil.Eventually(t, flavor+" sim prints its URL", 30*time.Second, func() bool {
		b, _ := os.ReadFile(logPath)
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "http://") {
				url = strings.TrimSpace(line)
				return true
			}
		}
		return false
	})
	return cmd.Process.Pid, url, logPath
}

// TestRunDiscoversEngines starts a heft-sim logging to a file and an agent
// with discover = true and no engine configured, then a second heft-sim of
// another flavour: the agent's snapshots report the first, then (after it
// looks again and restarts) both, each with its kind, URL, log, launch
// arguments and the pools its log printed, and nothing else. The search
// is limited to the sims' processes: other tests' engines may run on this
// host at the same time.
func TestRunDiscoversEngines(t *testing.T) {
	vPID, vURL, vLog := startSim(t, "vllm", "disc/vllm")
	want := map[string]struct{ kind, log, model string }{vURL: {"vllm", vLog, "disc/vllm"}}
	var sPID atomic.Int64
	coord := fakecoord.Start(t, "s3cret")
	cfg := writeRunConfig(t, fmt.Sprintf("discover = true\nstate_dir = %q\n[coordinator]\nurl = %q\ntoken_file = %q\n[node]\nname = \"disc\"\n",
		t.TempDir(), coord.URL, runTokenFile(t, 0o600)))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOut := &testutil.SyncBuffer{}
	exit := make(chan int, 1)
	d := discovery{every: 100 * time.Millisecond,
		opts: discover.Options{Keep: func(pid int) bool { return pid == vPID || int64(pid) == sPID.Load() }}}
	go func() {
		exit <- runAgentDiscovering(ctx, []string{"--config", cfg, "--snapshot-interval", "50ms", "--poll-interval", "100ms"},
			runNoEnv, IO{Out: &bytes.Buffer{}, Err: errOut}, d)
	}()
	defer func() {
		if t.Failed() {
			t.Logf("agent stderr:\n%s", errOut.String())
		}
	}()
	checkReported(t, coord, exit, want)

	pid, sURL, sLog := startSim(t, "sglang", "disc/sglang")
	sPID.Store(int64(pid))
	want[sURL] = struct{ kind, log, model string }{"sglang", sLog, "disc/sglang"}
	checkReported(t, coord, exit, want)
	if n := strings.Count(errOut.String(), `"@message":"found an engine"`); n != 2 {
		t.Errorf("the log says %d times that it found an engine, want 2", n)
	}
	stopAgent(t, cancel, exit)
}

// checkReported waits for the agent's next connection and a snapshot in
// which every engine of want is read, and checks that it reports those
// engines only, each as want says.
func checkReported(t *testing.T, coord *fakecoord.Coordinator, exit <-chan int, want map[string]struct{ kind, log, model string }) {
	t.Helper()
	fc := awaitConn(t, coord, exit)
	// Snapshots come every 50ms; wait for one where the engines are read.
	var engines []wire.Engine
	deadline := time.Now().Add(60 * time.Second)
	for ready := false; !ready; {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot with %d engines read; last: %+v", len(want), engines)
		}
		engines = fc.Next(t, wire.TypeSnapshot).Snapshot.Engines
		ready = len(engines) == len(want)
		for _, e := range engines {
			ready = ready && e.Ready && len(e.LaunchArgs) > 0 && len(e.Ranks) > 0
		}
	}
	for _, e := range engines {
		w, ok := want[e.URL]
		if !ok {
			t.Errorf("reported an engine the test did not start: %s at %s", e.Kind, e.URL)
			continue
		}
		if e.Kind != w.kind || e.Model != w.model {
			t.Errorf("%s: kind %s, model %s; want %s, %s", e.URL, e.Kind, e.Model, w.kind, w.model)
		}
		if e.LogSource == nil || e.LogSource.Spec != w.log {
			t.Errorf("%s: log source %+v, want %s", e.URL, e.LogSource, w.log)
		}
		if e.LaunchArgsSource != "cmdline" || !slices.Contains(e.LaunchArgs, "flavor="+w.kind) {
			t.Errorf("%s: launch args %v from %q, want the sim's command line", e.URL, e.LaunchArgs, e.LaunchArgsSource)
		}
	}
}

// An agent with no engine says so at warn, and one with discover = true
// that finds none says that too. The agent starts already stopped, so
// nothing is dialled.
func TestRunWarnsWithoutEngines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"none configured", nil, []string{`"@level":"warn","@message":"no engines configured`}},
		{"none found", []string{"--discover"}, []string{`"@level":"warn","@message":"discover = true found no engine on this host`,
			`"@level":"warn","@message":"no engines configured`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			errOut := &testutil.SyncBuffer{}
			args := append([]string{"--coordinator", "ws://127.0.0.1:1/api/v1/agent", "--state-dir", t.TempDir(),
				"--token-file", runTokenFile(t, 0o600), "--node", "gpu-test"}, tc.extra...)
			d := discovery{every: time.Hour, opts: discover.Options{Keep: func(int) bool { return false }}}
			if code := runAgentDiscovering(ctx, args, runNoEnv, IO{Out: &bytes.Buffer{}, Err: errOut}, d); code != 0 {
				t.Fatalf("exit %d:\n%s", code, errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("the log lacks %s:\n%s", w, errOut.String())
				}
			}
		})
	}
}

// inspect --discover shows what run's discover = true would find: the
// sim's kind, URL, log and the pools its log printed.
func TestInspectDiscovers(t *testing.T) {
	pid, url, logPath := startSim(t, "sglang", "disc/inspect")
	deps := inspectDeps{
		targets:  func() []inspectTarget { return nil },
		openGPUs: func(hclog.Logger) (gpu.Source, error) { return inspectFakeGPUs{}, nil },
		keep:     func(p int) bool { return p == pid },
	}
	var out, errb bytes.Buffer
	code := inspect([]string{"--discover", "--json"}, IO{In: strings.NewReader(""), Out: &out, Err: &errb}, deps)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s\n%s", code, errb.String(), out.String())
	}
	var rep inspectReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Engines) != 1 {
		t.Fatalf("engines %+v, want the sim alone", rep.Engines)
	}
	e := rep.Engines[0]
	if e.Kind != "sglang" || e.URL != url || e.Model != "disc/inspect" || e.LogSource == nil || e.LogSource.Spec != logPath || len(e.Ranks) == 0 {
		t.Errorf("engine %+v (log %+v), want sglang at %s logging to %s with its pools", e, e.LogSource, url, logPath)
	}
}
