package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"heft/agent/engine/launch"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// The CLI's JSON outputs, compared byte for byte with golden files under
// testdata/golden (go test ./agent/cli -run Golden -update rewrites them;
// review the diff). Where an output holds what changes from run to run
// (ports, times, this host, measured speeds), the test says so and masks
// exactly that, so a renamed or lost field still fails.

func golden(name string) string { return filepath.Join("testdata", "golden", name) }

var lastLineAtRE = regexp.MustCompile(`"last_line_at":"[^"]*"`)

func TestGoldenPoolsJSON(t *testing.T) {
	for _, tc := range []struct {
		kind, log, golden string
		code              int // 2: the pools are CRITICAL
	}{
		{"sglang", "logs/sglang-dp2-uneven.log", "pools-sglang-dp2-uneven.json", 2},
		{"sglang", "logs/sglang-restart.log", "pools-sglang-restart.json", 0},
		{"vllm", "engines/vllm-dp2.log", "pools-vllm-dp2.json", 0},
		{"vllm", "engines/vllm-single.log", "pools-vllm-single.json", 0},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Main([]string{"pools", "--engine", tc.kind, "--log", testutil.Testdata(t, tc.log), "--json"}, strings.NewReader(""), &out, &errOut)
			if code != tc.code || errOut.Len() > 0 {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			// Masked: the log's place on this machine and when it was read.
			got := strings.ReplaceAll(out.String(), testutil.RepoRoot(t), "/REPO")
			got = lastLineAtRE.ReplaceAllString(got, `"last_line_at":"(when read)"`)
			testutil.Golden(t, golden(tc.golden), []byte(got))

			// The table says the same to a person.
			out.Reset()
			if code := Main([]string{"pools", "--engine", tc.kind, "--log", testutil.Testdata(t, tc.log)}, strings.NewReader(""), &out, &errOut); code != tc.code {
				t.Fatalf("table: exit %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			testutil.Golden(t, golden(strings.TrimSuffix(tc.golden, ".json")+".txt"), out.Bytes())
		})
	}
}

// inspect --json against one simulated engine of each kind, on a host
// whose GPUs are fixed. Masked: the host (this machine), the engines'
// ports (and the capacity keys that hash them) and the logs' folder, and
// when the pools were read.
func TestGoldenInspectJSON(t *testing.T) {
	dir := t.TempDir()
	var args []string
	var urls []string
	for _, e := range []struct {
		kind string
		cfg  sim.Config
		log  bool
	}{
		{"vllm", sim.Config{Flavor: sim.FlavorVLLM, DP: 2, KVTokens: []int64{24094, 2925}}, true},
		{"sglang", sim.Config{Flavor: sim.FlavorSGLang, DP: 2, KVTokens: []int64{30000, 30000}}, true},
		{"llamacpp", sim.Config{Flavor: sim.FlavorLlamaCpp}, false},
		{"ollama", sim.Config{Flavor: sim.FlavorOllama}, false},
		{"mlx", sim.Config{Flavor: sim.FlavorMLX}, false},
	} {
		spec := e.kind + "="
		if e.log {
			e.cfg.LogPath = filepath.Join(dir, e.kind+".log")
		}
		s := inspectSim(t, e.cfg)
		spec += s.URL()
		if e.log {
			spec += ",log=" + e.cfg.LogPath
		}
		args = append(args, "--engine", spec)
		urls = append(urls, s.URL())
	}
	gpus := []wire.GPU{{Index: 0, UUID: "GPU-0", Name: "NVIDIA L4", MemoryTotal: 23 << 30, MemoryFree: 3 << 30,
		SMClockMHz: 2040, SMClockMaxMHz: 2040, TemperatureC: 55, PowerDrawW: 40, PowerLimitW: 72}}
	code, out, errOut := inspectWith(t, gpus, nil, nil, append(args, "--json", "--node", "gpu-a")...)
	if code != 2 {
		t.Fatalf("exit %d, want 2: the vLLM pools are CRITICAL; stderr %s", code, errOut)
	}

	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	rep["host"] = "(this host)"
	for _, l := range rep["logs"].([]any) {
		l := l.(map[string]any)
		if l["last_line_at"] == nil {
			t.Errorf("log %v: no last_line_at", l["spec"])
		}
		l["last_line_at"] = "(when read)"
	}
	for _, e := range rep["engines"].([]any) {
		e := e.(map[string]any)
		if e["ranks_at"] != nil {
			e["ranks_at"] = "(when read)"
		}
		// The port is a launch argument, so the capacity key changes with
		// it: checked here against the arguments, then masked.
		args, _ := e["launch_args"].([]any)
		var norm []string
		for _, a := range args {
			norm = append(norm, a.(string))
		}
		if i := slices.IndexFunc(norm, func(a string) bool { return strings.HasPrefix(a, "port=") }); i >= 0 {
			if want := launch.CapacityKey("gpu-a", e["kind"].(string), e["model"].(string), norm); e["capacity_key"] != want {
				t.Errorf("%s: capacity key %v, want %s from its launch arguments", e["kind"], e["capacity_key"], want)
			}
			args[i] = "port=(the engine's port)"
			e["capacity_key"] = "(hashes the port)"
		}
	}
	masked, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(masked)+"\n", dir, "/LOGS")
	for i, u := range urls {
		text = strings.ReplaceAll(text, u, fmt.Sprintf("http://127.0.0.1:PORT%d", i))
		// The listening sockets, in "listen" and the not_routable warning.
		text = strings.ReplaceAll(text, strings.TrimPrefix(u, "http://"), fmt.Sprintf("127.0.0.1:PORT%d", i))
	}
	testutil.Golden(t, golden("inspect.json"), []byte(text))
}

// probe --json against a simulated vLLM. Masked: the port and every
// measured time and speed; the rest (what was asked, what came back,
// the verdict) is fixed by the request.
func TestGoldenProbeJSON(t *testing.T) {
	s := prefillProbeSim(t, sim.Faults{})
	code, out, errOut := probeMain("--url", s.URL(), "--engine", "vllm", "--concurrency", "4", "--tokens", "16",
		"--prefill", "--prefill-tokens", "1024", "--json")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"throughput_tps", "warmup_tps", "wall_seconds", "decode_tps_p50", "decode_tps_p95",
		"ttft_seconds_p50", "ttft_seconds_p95", "started_at", "finished_at"} {
		v, ok := m[key]
		if !ok {
			t.Errorf("no %s in the output", key)
			continue
		}
		if f, isNum := v.(float64); isNum && f <= 0 {
			t.Errorf("%s = %v, want a measured value", key, v)
		}
		m[key] = "(measured)"
	}
	pf, _ := m["prefill"].(map[string]any)
	for _, key := range []string{"prefill_tps", "warmup_tps", "wall_seconds", "ttft_seconds_p50", "ttft_seconds_p95"} {
		if v, ok := pf[key].(float64); !ok || v <= 0 {
			t.Errorf("prefill.%s = %v, want a measured value", key, pf[key])
		}
		pf[key] = "(measured)"
	}
	masked, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(masked)+"\n", s.URL(), "http://127.0.0.1:PORT")
	testutil.Golden(t, golden("probe.json"), []byte(text))
}
