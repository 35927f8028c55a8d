package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/shared/wire"
	"heft/sim"
)

// inspectFakeGPUs is a gpu.Source with fixed devices.
type inspectFakeGPUs struct{ gpus []wire.GPU }

func (f inspectFakeGPUs) Devices(context.Context) ([]wire.GPU, error) { return f.gpus, nil }
func (f inspectFakeGPUs) Close() error                                { return nil }

// inspectWith runs inspect with the GPU source and the default engine
// addresses replaced, and returns exit code, stdout and stderr.
func inspectWith(t *testing.T, gpus []wire.GPU, gpuErr error, targets []inspectTarget, args ...string) (int, string, string) {
	t.Helper()
	deps := inspectDeps{
		targets:  func() []inspectTarget { return targets },
		openGPUs: func(hclog.Logger) (gpu.Source, error) { return inspectFakeGPUs{gpus: gpus}, gpuErr },
	}
	var out, errb bytes.Buffer
	code := inspect(args, IO{In: strings.NewReader(""), Out: &out, Err: &errb}, deps)
	return code, out.String(), errb.String()
}

// inspectDeadURL is a loopback URL where nothing listens.
func inspectDeadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func inspectSim(t *testing.T, cfg sim.Config) *sim.Server {
	t.Helper()
	if cfg.SingleTPS == 0 {
		cfg.SingleTPS, cfg.Batch16TPS = 60, 600
	}
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var errNoNVML = fmt.Errorf("%w: NVML library not found", gpu.ErrUnavailable)

func TestInspectNothingHere(t *testing.T) {
	dead := []inspectTarget{{URL: inspectDeadURL(t), Kinds: "vllm"}, {URL: inspectDeadURL(t), Kinds: "ollama"}}
	code, out, errOut := inspectWith(t, nil, errNoNVML, dead)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{
		"no GPUs found (gpu facts unavailable: NVML library not found)",
		"no engine found on the default ports (vllm 127.0.0.1:",
		"; pass --engine or --config",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, _ = inspectWith(t, nil, errNoNVML, dead, "--json")
	var rep map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("exit %d, output %s", code, out)
	}
	if rep["gpu_error"] != "gpu facts unavailable: NVML library not found" {
		t.Errorf("gpu_error %v", rep["gpu_error"])
	}
	for _, key := range []string{"gpus", "engines", "warnings"} {
		if list, ok := rep[key].([]any); !ok || len(list) != 0 {
			t.Errorf("%s = %v, want an empty list", key, rep[key])
		}
	}
	if h, ok := rep["host"].(map[string]any); !ok || h["hostname"] == "" {
		t.Errorf("host %v", rep["host"])
	}
}

// The uneven-pool story from PRODUCT.md, end to end against the simulator.
func TestInspectUnevenSGLangSim(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "sglang.log")
	s := inspectSim(t, sim.Config{Flavor: "sglang", DP: 2, KVTokens: []int64{24094, 2925}, LogPath: logPath})
	gpus := []wire.GPU{{Index: 0, UUID: "GPU-0", Name: "NVIDIA L4", MemoryTotal: 23 << 30, MemoryFree: 3 << 30,
		SMClockMHz: 2040, SMClockMaxMHz: 2040, TemperatureC: 55, PowerDrawW: 40, PowerLimitW: 72}}
	code, out, errOut := inspectWith(t, gpus, nil, nil, "--engine", "sglang="+s.URL()+",log="+logPath, "--node", "gpu-a")
	if code != 2 {
		t.Fatalf("exit %d, want 2 for a CRITICAL warning; stderr %s", code, errOut)
	}
	for _, want := range []string{
		"node  gpu-a", "[0] NVIDIA L4  GPU-0", "SM clock 2040 / 2040 MHz",
		"engine sglang at " + s.URL(), "ready        yes",
		"rank 0: 24,094 tokens", "rank 1: 2,925 tokens", "smallest/largest 0.12 (from " + logPath + ")",
		"capacity key", "CRITICAL dp_pool_imbalance",
		"runs at once 4096 sequences (server_info effective_max_running_requests_per_dp)",
		"gateways use " + s.URL() + " (the engine listens on " + strings.TrimPrefix(s.URL(), "http://") + " only; see the warnings)",
		"WARNING not_routable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	code, out, _ = inspectWith(t, gpus, nil, nil, "--json", "--engine", "sglang="+s.URL()+",log="+logPath)
	var rep inspectReport
	if code != 2 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("exit %d, output %s", code, out)
	}
	if len(rep.Engines) != 1 || len(rep.Engines[0].Ranks) != 2 || rep.Engines[0].Ranks[1].KVTokens != 2925 {
		t.Fatalf("engines %+v", rep.Engines)
	}
	if len(rep.Warnings) == 0 || rep.Warnings[0].Code != "dp_pool_imbalance" || rep.Warnings[0].Severity != "critical" ||
		rep.Warnings[0].Engine != s.URL() {
		t.Errorf("warnings %+v", rep.Warnings)
	}
}

func TestInspectFindsEnginesOnDefaultPorts(t *testing.T) {
	vllm := inspectSim(t, sim.Config{Flavor: "vllm", DP: 2})
	ollama := inspectSim(t, sim.Config{Flavor: "ollama"})
	targets := []inspectTarget{{URL: vllm.URL(), Kinds: "vllm"}, {URL: inspectDeadURL(t), Kinds: "sglang"}, {URL: ollama.URL(), Kinds: "ollama"}}
	code, out, errOut := inspectWith(t, nil, errNoNVML, targets, "--json")
	if code != 0 {
		t.Fatalf("exit %d (healthy engines, no CRITICAL warning), stderr %s", code, errOut)
	}
	var rep inspectReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Engines) != 2 || rep.Engines[0].Kind != "vllm" || rep.Engines[1].Kind != "ollama" {
		t.Fatalf("engines %+v", rep.Engines)
	}
	if v := rep.Engines[0]; !v.Ready || v.Error != "" || len(v.Load.Ranks) != 2 || v.CapacityKey == "" {
		t.Errorf("vllm %+v", v)
	}
}

func TestInspectUnreadableEngines(t *testing.T) {
	dead := inspectDeadURL(t)
	code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--engine", "vllm="+dead, "--timeout", "2s")
	if code != 2 || errOut != "" {
		t.Fatalf("exit %d, stderr %q: want 2 (a CRITICAL warning shown) and the findings on stdout only", code, errOut)
	}
	for _, want := range []string{"error        GET /v1/models: engine unreachable: connection refused", "ready        no",
		"CRITICAL engine_unreachable"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestInspectConfig(t *testing.T) {
	s := inspectSim(t, sim.Config{Flavor: "llamacpp"})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "agent.toml")
	toml := fmt.Sprintf("[node]\nname = \"mac-studio\"\n\n[[engine]]\nkind = \"llamacpp\"\nurl = %q\nadvertise_url = \"http://mac-studio.lan:8080\"\n", s.URL())
	if err := os.WriteFile(cfgPath, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--config", cfgPath)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{"node  mac-studio", "engine llamacpp at " + s.URL(), "(from props)",
		"runs at once 16 sequences (props total_slots)", "gateways use http://mac-studio.lan:8080 (advertise_url)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, _, errOut := inspectWith(t, nil, errNoNVML, nil, "--config", filepath.Join(dir, "missing.toml")); code != 1 || !strings.Contains(errOut, "missing.toml") {
		t.Errorf("missing config: exit %d, stderr %q", code, errOut)
	}
}

// An engine listening on every interface is offered to gateways at this
// node's primary address, and inspect says so.
func TestInspectEngineOnEveryInterface(t *testing.T) {
	primary, err := engine.PrimaryAddress(true)
	if err != nil {
		t.Skipf("this host has no primary address: %v", err)
	}
	// Bound to every IPv4 interface; the test dials it at 127.0.0.1 only.
	s, err := sim.Start(sim.Config{Flavor: "llamacpp", SingleTPS: 60, Batch16TPS: 600}, "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	port := s.URL()[strings.LastIndexByte(s.URL(), ':')+1:]
	local := "http://127.0.0.1:" + port
	code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--engine", "llamacpp="+local)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	// Go binds 0.0.0.0 as a dual-stack [::] socket where it can.
	want := "gateways use http://" + primary.String() + ":" + port + " (this node's primary address: the engine listens on "
	if !strings.Contains(out, want) || strings.Contains(out, "not_routable") {
		t.Errorf("output lacks %q (or warns):\n%s", want, out)
	}
	code, out, _ = inspectWith(t, nil, errNoNVML, nil, "--json", "--engine", "llamacpp="+local)
	var rep inspectReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Engines) != 1 {
		t.Fatalf("exit %d, output %s", code, out)
	}
	if e := rep.Engines[0]; e.AdvertiseURL != "http://"+primary.String()+":"+port || e.AdvertiseSource != wire.AdvertiseNodeAddress {
		t.Errorf("json: advertise %q (%s)", e.AdvertiseURL, e.AdvertiseSource)
	}
}

func TestInspectBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--engine", "vllm"},
		{"--engine", "no-such-engine=http://127.0.0.1:8000"},
		{"--engine", "vllm=127.0.0.1:8000"},
		{"--engine", "vllm=http://127.0.0.1:8000,lgo=/x"},
		{"--timeout", "0s"},
		{"--timeout", "soon"},
		{"--bogus"},
		{"extra"},
	} {
		code, out, errOut := inspectWith(t, nil, errNoNVML, nil, args...)
		if code != 2 || out != "" || errOut == "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 with a message", args, code, out, errOut)
		}
	}
	if code, _, _ := inspectWith(t, nil, errNoNVML, nil, "-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

// On the real host: whatever GPUs (or none) and engines are here, inspect
// reports and exits 0.
func TestInspectRealHost(t *testing.T) {
	deps := hostInspectDeps()
	deps.targets = func() []inspectTarget { return nil }
	var out, errb bytes.Buffer
	code := inspect([]string{"--json"}, IO{In: strings.NewReader(""), Out: &out, Err: &errb}, deps)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	var rep inspectReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.GPUs) == 0 && rep.GPUError == "" {
		t.Error("no GPUs and no reason why")
	}
	for _, g := range rep.GPUs {
		if g.Name == "" && g.Error == "" {
			t.Errorf("GPU %d has neither a name nor an error", g.Index)
		}
	}
}

// An engine named by a flag and by the config under another spelling of
// its URL is inspected once, as the flag names it.
func TestInspectMergeOneEngineTwoSpellings(t *testing.T) {
	flags := []engine.Config{{Kind: "vllm", URL: "http://localhost:8000"}}
	fromConfig := []engine.Config{{Kind: "vllm", URL: "http://127.0.0.1:8000/v1"}, {Kind: "sglang", URL: "http://127.0.0.1:30000"}}
	got := inspectMerge(flags, fromConfig)
	if len(got) != 2 || got[0].URL != "http://localhost:8000" || got[1].URL != "http://127.0.0.1:30000" {
		t.Fatalf("merged %+v; want the flag's engine and the config's other one", got)
	}
}
