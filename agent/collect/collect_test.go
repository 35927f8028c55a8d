package collect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// fakeGPUs is a gpu.Source with fixed devices.
type fakeGPUs struct {
	mu     sync.Mutex
	gpus   []wire.GPU
	err    error
	closed bool
}

func (f *fakeGPUs) Devices(ctx context.Context) ([]wire.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.gpus), f.err
}

func (f *fakeGPUs) Close() error { f.closed = true; return nil }

// startEngine serves a kind's fixture files on 127.0.0.1.
func startEngine(t *testing.T, kind string) *httptest.Server {
	t.Helper()
	routes := map[string]map[string]string{
		"vllm": {"/v1/models": "http/vllm/v1_models.json", "/version": "http/vllm/version.json", "/health": "",
			"/metrics": "engines/vllm-dp2-metrics.txt"},
		"sglang": {"/v1/models": "http/sglang/v1_models.json", "/server_info": "http/sglang/server_info.json", "/health": "",
			"/metrics": "engines/sglang-dp2-uneven-metrics.txt"},
	}[kind]
	files := map[string][]byte{}
	for path, file := range routes {
		if file != "" {
			files[path] = testutil.ReadTestdata(t, file)
		} else {
			files[path] = nil
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

func TestSnapshot(t *testing.T) {
	vllm := startEngine(t, "vllm")
	sglang := startEngine(t, "sglang")
	gpus := &fakeGPUs{gpus: []wire.GPU{
		{Index: 0, UUID: "GPU-0", Name: "NVIDIA L4", MemoryTotal: 24 << 30, Processes: []wire.GPUProcess{{PID: 4242, Name: "python3", UsedMemory: 18 << 30}}},
		{Index: 1, UUID: "GPU-1", Name: "NVIDIA L4", MemoryTotal: 24 << 30},
	}, err: errors.New("device 2: unknown error")}
	c, err := New(Config{Node: "gpu-a", GPUError: "nvml: partial", Engines: []engine.Config{
		{Kind: "vllm", URL: vllm.URL}, {Kind: "sglang", URL: sglang.URL + "/"},
	}}, gpus, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	snap := c.Snapshot(t.Context())
	if _, err := wire.Encode(&snap); err != nil {
		t.Fatalf("the coordinator would refuse this snapshot: %v", err)
	}
	if snap.Node != "gpu-a" || snap.Host.Hostname == "" || snap.At.IsZero() {
		t.Errorf("node %q host %+v at %v", snap.Node, snap.Host, snap.At)
	}
	if snap.GPUError != "nvml: partial; device 2: unknown error" {
		t.Errorf("gpu error %q", snap.GPUError)
	}
	if len(snap.GPUs) != 2 || snap.GPUs[0].Processes[0].Foreign {
		t.Errorf("gpus %+v: with no engine tree known nothing may be called foreign", snap.GPUs)
	}
	if len(snap.Engines) != 2 {
		t.Fatalf("%d engines", len(snap.Engines))
	}
	v, s := snap.Engines[0], snap.Engines[1]
	if v.Kind != "vllm" || v.Error != "" || v.Load.Running != 14 || v.CapacityKey == "" {
		t.Errorf("vllm %+v", v)
	}
	if s.Kind != "sglang" || s.Error != "" || len(s.Ranks) != 2 || s.Ranks[1].KVTokens != 2925 {
		t.Errorf("sglang %+v", s)
	}
	for _, e := range snap.Engines {
		cl, ok := c.Engine(e.CapacityKey)
		if !ok || cl.URL() != e.URL {
			t.Errorf("Engine(%q) = %v, %v", e.CapacityKey, cl, ok)
		}
	}
	if _, ok := c.Engine("nope"); ok {
		t.Error("unknown key found")
	}
	if got := c.Clients(); len(got) != 2 || got[0].URL() != vllm.URL {
		t.Errorf("clients %v", got)
	}
}

func TestSnapshotUnreachableEngine(t *testing.T) {
	srv := startEngine(t, "vllm")
	url := srv.URL
	srv.Close()
	c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: "vllm", URL: url}}}, &fakeGPUs{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	snap := c.Snapshot(t.Context())
	if _, err := wire.Encode(&snap); err != nil {
		t.Fatal(err)
	}
	if e := snap.Engines[0]; !strings.Contains(e.Error, "connection refused") || e.Ready {
		t.Errorf("engine %+v", e)
	}
	if snap.GPUs == nil || snap.Engines == nil {
		t.Error("lists must be empty, not null, on the wire")
	}
}

// followLog writes content to logPath and starts a collector of one vLLM
// engine at url that follows that log until cancel.
func followLog(t *testing.T, url, logPath, content string) (*Collector, context.Context, context.CancelFunc) {
	t.Helper()
	if err := os.WriteFile(logPath, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: "vllm", URL: url, Log: logPath}}}, &fakeGPUs{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	c.Start(ctx)
	return c, ctx, cancel
}

func TestStartFollowsLog(t *testing.T) {
	srv := startEngine(t, "vllm")
	logPath := filepath.Join(t.TempDir(), "vllm.log")
	full := string(testutil.ReadTestdata(t, "engines/vllm-dp2.log"))
	cut := strings.Index(full, "(EngineCore_DP0 pid=212) INFO 12-11 09:14:37 [kv_cache_utils.py")
	if cut < 0 {
		t.Fatal("fixture changed")
	}
	c, ctx, cancel := followLog(t, srv.URL, logPath, full[:cut])
	defer cancel()
	c.Start(ctx) // a second Start starts no second follower

	var e wire.Engine
	testutil.Eventually(t, "launch args from the log", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return e.LaunchArgsSource == "log"
	})
	if len(e.Ranks) != 0 {
		t.Fatalf("pools before the pool lines: %+v", e.Ranks)
	}
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(full[cut:]); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	want := []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373552}}
	testutil.Eventually(t, "pools from the log", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return reflect.DeepEqual(e.Ranks, want)
	})
	if e.RanksSource != logPath {
		t.Errorf("ranks source %q", e.RanksSource)
	}
	key := e.CapacityKey

	// The engine restarts with other arguments and the log is rewritten.
	if err := os.WriteFile(logPath, testutil.ReadTestdata(t, "engines/vllm-single.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the new start-up's pool", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return reflect.DeepEqual(e.Ranks, []wire.Rank{{DPRank: 0, KVTokens: 379088}})
	})
	if e.CapacityKey == key {
		t.Error("other launch args kept the capacity key")
	}
	cancel()
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a deadline, not a speed
		t.Fatal("followers did not end with their context")
	}
}

// A restarted engine's log read between its banner and its launch-args
// line names no launch: for that moment the engine is reported without a
// capacity key (still ready, as it is), so the coordinator cannot send a
// burst to a launch "without arguments" that never ran (CI saw exactly
// that once), and keeps routing the worker it knows at that URL. A banner
// with nothing after it for caughtUp names the engine as it is.
func TestBannerOnlyRestartNamesNoLaunch(t *testing.T) {
	srv := startEngine(t, "vllm")
	logPath := filepath.Join(t.TempDir(), "vllm.log")
	full := string(testutil.ReadTestdata(t, "engines/vllm-single.log"))
	banner, rest, ok := strings.Cut(full, "\n")
	if !ok || !strings.Contains(banner, "server version") || !strings.Contains(rest, "non-default args") {
		t.Fatal("fixture changed")
	}
	args, _, _ := strings.Cut(rest, "\n")
	c, ctx, cancel := followLog(t, srv.URL, logPath, full)
	defer c.Wait()
	defer cancel()

	var e wire.Engine
	testutil.Eventually(t, "the first start-up read whole", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return e.LaunchArgsSource == "log" && e.Ready && e.CapacityKey != ""
	})
	key := e.CapacityKey

	// The engine restarts; the follower has read its banner only.
	restart := func(pid string) {
		t.Helper()
		b := strings.Replace(banner, "pid=1)", "pid="+pid+")", 1) + "\n"
		if err := os.WriteFile(logPath, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "the banner read: no key, still ready", 15*time.Second, func() bool {
			e = c.Snapshot(ctx).Engines[0]
			return e.CapacityKey == "" && e.Ready
		})
	}
	restart("2")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(args + "\n"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	testutil.Eventually(t, "the launch args read: the same launch again", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return e.CapacityKey != "" && e.Ready
	})
	if e.CapacityKey != key || e.LaunchArgsSource != "log" {
		t.Fatalf("after the args line: key %q from %q, want %q from the log", e.CapacityKey, e.LaunchArgsSource, key)
	}

	// A banner alone for longer than caughtUp: an engine that prints no
	// launch args; it is named without them.
	restart("3")
	testutil.Eventually(t, "the engine named without launch args", 15*time.Second, func() bool {
		e = c.Snapshot(ctx).Engines[0]
		return e.CapacityKey != "" && e.Ready
	})
	if e.CapacityKey == key || e.LaunchArgsSource != "" {
		t.Fatalf("banner only: key %q from %q, want another key, from no launch args", e.CapacityKey, e.LaunchArgsSource)
	}
}

func TestFollowMissingLogRetries(t *testing.T) {
	srv := startEngine(t, "sglang")
	logPath := filepath.Join(t.TempDir(), "later.log")
	c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: "sglang", URL: srv.URL, Log: logPath}}}, &fakeGPUs{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); c.Wait() }()
	c.Start(ctx)
	if e := c.Snapshot(ctx).Engines[0]; e.RanksSource != engine.SourceMetrics {
		t.Fatalf("before the log exists: ranks from %q", e.RanksSource)
	}
	if err := os.WriteFile(logPath, testutil.ReadTestdata(t, "engines/sglang-dp2-even.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "pools from the log once it appears", 15*time.Second, func() bool {
		return c.Snapshot(ctx).Engines[0].RanksSource == logPath
	})
}

func TestReadLogsOnce(t *testing.T) {
	srv := startEngine(t, "vllm")
	dir := t.TempDir()
	logPath := filepath.Join(dir, "vllm.log")
	noPools := filepath.Join(dir, "args-only.log")
	if err := os.WriteFile(logPath, testutil.ReadTestdata(t, "engines/vllm-dp2.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	full := string(testutil.ReadTestdata(t, "engines/vllm-single.log"))
	if err := os.WriteFile(noPools, []byte(strings.SplitAfterN(full, "\n", 3)[0]+strings.SplitAfterN(full, "\n", 3)[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	srv2 := startEngine(t, "vllm")
	srv3 := startEngine(t, "vllm")
	c, err := New(Config{Node: "n", Engines: []engine.Config{
		{Kind: "vllm", URL: srv.URL, Log: logPath},
		{Kind: "vllm", URL: srv2.URL, Log: noPools},
		{Kind: "vllm", URL: srv3.URL, Log: filepath.Join(dir, "missing.log")},
	}}, &fakeGPUs{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	err = c.ReadLogsOnce(t.Context())
	if err == nil || !strings.Contains(err.Error(), "missing.log") || strings.Contains(err.Error(), "args-only") {
		t.Errorf("error %v: want the missing log named, and a log without pools accepted", err)
	}
	snap := c.Snapshot(t.Context())
	if e := snap.Engines[0]; len(e.Ranks) != 2 || e.RanksSource != logPath {
		t.Errorf("engine 0 ranks %+v from %q", e.Ranks, e.RanksSource)
	}
	if e := snap.Engines[1]; e.LaunchArgsSource != "log" || len(e.Ranks) != 0 {
		t.Errorf("engine 1 args from %q, ranks %+v", e.LaunchArgsSource, e.Ranks)
	}
}

func TestNewRejects(t *testing.T) {
	many := make([]engine.Config, wire.MaxEngines+1)
	for i := range many {
		many[i] = engine.Config{Kind: "vllm", URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)}
	}
	for name, tt := range map[string]struct {
		cfg  Config
		want string
	}{
		"bad kind": {Config{Engines: []engine.Config{{Kind: "no-such-engine", URL: "http://127.0.0.1:1"}}}, "not one of"},
		"bad url":  {Config{Engines: []engine.Config{{Kind: "vllm", URL: "127.0.0.1:1"}}}, "scheme"},
		"twice":    {Config{Engines: []engine.Config{{Kind: "vllm", URL: "http://127.0.0.1:1"}, {Kind: "sglang", URL: "http://127.0.0.1:1/"}}}, "twice"},
		"too many": {Config{Engines: many}, "at most"},
	} {
		if _, err := New(tt.cfg, &fakeGPUs{}, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", name, err, tt.want)
		}
	}
	if _, err := New(Config{}, nil, nil); err == nil {
		t.Error("nil gpu source accepted")
	}
	// A log of a kind heft reads no log of is ignored, not an error.
	c, err := New(Config{Engines: []engine.Config{{Kind: "mlx", URL: "http://127.0.0.1:1", Log: "/var/log/mlx.log"}}}, &fakeGPUs{}, nil)
	if err != nil || c.cfg.Node == "" {
		t.Fatalf("mlx with a log: %v (node %q)", err, c.cfg.Node)
	}
	if l := c.engines[0].logStatus(); l == nil || !strings.Contains(l.Error, "start-up logs of vllm, sglang, llamacpp, ollama only, and this engine is mlx") {
		t.Errorf("an ignored log's status %+v", l)
	}
	// A log source that is no source is a configuration error.
	if _, err := New(Config{Engines: []engine.Config{{Kind: "vllm", URL: "http://127.0.0.1:1", Log: "journal:vllm"}}}, &fakeGPUs{}, nil); err == nil ||
		!strings.Contains(err.Error(), `unknown kind "journal:"`) {
		t.Errorf("bad log source: %v", err)
	}
}

func TestMarkForeign(t *testing.T) {
	gpus := []wire.GPU{
		{Index: 0, UUID: "A", Processes: []wire.GPUProcess{{PID: 10}, {PID: 11}, {PID: 99}}},
		{Index: 1, UUID: "B", Processes: []wire.GPUProcess{{PID: 20}, {PID: 99}}},
		{Index: 2, UUID: "C", Processes: []wire.GPUProcess{{PID: 77}}},
	}
	foreign := func(out []wire.GPU) map[string][]int {
		m := map[string][]int{}
		for _, g := range out {
			for _, p := range g.Processes {
				if p.Foreign {
					m[g.UUID] = append(m[g.UUID], p.PID)
				}
			}
		}
		return m
	}
	engA := wire.Engine{URL: "a", PID: 10, GPUUUIDs: []string{"A"}, ForeignProcesses: []wire.GPUProcess{{PID: 99}}}
	engB := wire.Engine{URL: "b", PID: 20, GPUUUIDs: []string{"B"}, ForeignProcesses: []wire.GPUProcess{{PID: 99}}}
	engUnknown := wire.Engine{URL: "c"}
	tests := []struct {
		name    string
		engines []wire.Engine
		want    map[string][]int
	}{
		{"no engines: nothing judged", nil, map[string][]int{}},
		{"every tree known: all others foreign", []wire.Engine{engA, engB}, map[string][]int{"A": {99}, "B": {99}, "C": {77}}},
		{"one tree unknown: only what a known engine saw", []wire.Engine{engA, engUnknown}, map[string][]int{"A": {99}, "B": {99}}},
		{"another engine's process is not foreign", []wire.Engine{
			{URL: "a", PID: 10, GPUUUIDs: []string{"A"}, ForeignProcesses: []wire.GPUProcess{{PID: 11}, {PID: 99}}},
			{URL: "d", PID: 11, GPUUUIDs: []string{"A"}, ForeignProcesses: []wire.GPUProcess{{PID: 10}, {PID: 99}}},
		}, map[string][]int{"A": {99}, "B": {20, 99}, "C": {77}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := MarkForeign(gpus, tt.engines)
			if got := foreign(out); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("foreign %v want %v", got, tt.want)
			}
			if foreign(gpus)["A"] != nil {
				t.Error("input modified")
			}
		})
	}
}

func TestSignificant(t *testing.T) {
	base := wire.Snapshot{
		Node: "n",
		GPUs: []wire.GPU{{Index: 0, UUID: "A", SMClockMHz: 1400, TemperatureC: 60, MemoryFree: 1 << 30,
			Processes: []wire.GPUProcess{{PID: 5, UsedMemory: 1 << 30, Foreign: true}}}},
		Engines: []wire.Engine{{Kind: "vllm", URL: "u", Ready: true, Model: "m", CapacityKey: "k",
			LaunchArgs: []string{"a=1"}, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 100}},
			Load: wire.Load{Known: true, Running: 1}, RanksAt: time.Unix(1, 0)}},
	}
	clone := func(mod func(*wire.Snapshot)) wire.Snapshot {
		s := base
		s.GPUs = slices.Clone(base.GPUs)
		s.GPUs[0].Processes = slices.Clone(base.GPUs[0].Processes)
		s.Engines = slices.Clone(base.Engines)
		mod(&s)
		return s
	}
	tests := []struct {
		name string
		mod  func(*wire.Snapshot)
		want bool
	}{
		{"nothing", func(*wire.Snapshot) {}, false},
		{"clock, temperature, free memory", func(s *wire.Snapshot) {
			s.GPUs[0].SMClockMHz, s.GPUs[0].TemperatureC, s.GPUs[0].MemoryFree = 900, 83, 2<<30
			s.GPUs[0].Processes[0].UsedMemory = 2 << 30
		}, false},
		{"a power cap", func(s *wire.Snapshot) { s.GPUs[0].ClockEventReasons = []string{"sw_power_cap"} }, false},
		{"a thermal slowdown", func(s *wire.Snapshot) { s.GPUs[0].ClockEventReasons = []string{"sw_power_cap", "hw_thermal_slowdown"} }, true},
		{"load and times", func(s *wire.Snapshot) {
			s.Engines[0].Load = wire.Load{Known: true, Running: 9, Waiting: 3, KVUsage: 0.5}
			s.Engines[0].RanksAt = time.Unix(2, 0)
			s.At = time.Unix(3, 0)
		}, false},
		{"ready", func(s *wire.Snapshot) { s.Engines[0].Ready = false }, true},
		{"error", func(s *wire.Snapshot) { s.Engines[0].Error = "connection refused" }, true},
		{"model", func(s *wire.Snapshot) { s.Engines[0].Model = "m2" }, true},
		{"capacity key", func(s *wire.Snapshot) { s.Engines[0].CapacityKey = "k2" }, true},
		{"launch args", func(s *wire.Snapshot) { s.Engines[0].LaunchArgs = []string{"a=2"} }, true},
		{"ranks", func(s *wire.Snapshot) { s.Engines[0].Ranks = []wire.Rank{{DPRank: 0, KVTokens: 99}} }, true},
		{"engine gone", func(s *wire.Snapshot) { s.Engines = nil }, true},
		{"engine replaced", func(s *wire.Snapshot) { s.Engines[0].URL = "v" }, true},
		{"gpu set", func(s *wire.Snapshot) { s.GPUs = append(s.GPUs, wire.GPU{Index: 1, UUID: "B"}) }, true},
		{"gpu error", func(s *wire.Snapshot) { s.GPUError = "nvml gone" }, true},
		{"foreign process appears", func(s *wire.Snapshot) {
			s.GPUs[0].Processes = append(s.GPUs[0].Processes, wire.GPUProcess{PID: 6, Foreign: true})
		}, true},
		{"engine's foreign list", func(s *wire.Snapshot) { s.Engines[0].ForeignProcesses = []wire.GPUProcess{{PID: 5}} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Significant(base, clone(tt.mod)); got != tt.want {
				t.Errorf("Significant = %v, want %v", got, tt.want)
			}
		})
	}
}
