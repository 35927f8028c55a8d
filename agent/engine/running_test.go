package engine

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/wire"
	"heft/sim"
)

// What each kind of engine runs at once, read as the agent reads a real
// one: a heft-sim of each kind running 12 sequences per rank, with its
// start-up log where the kind has one the agent reads.
func TestMaxRunningFromSims(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		dp      int
		want    int
		wantSrc string
	}{
		// vLLM prints max_num_seqs among its non-default args.
		{"vllm", 2, 24, "log"},
		{"vllm", 1, 12, "log"},
		// SGLang says it per rank in /server_info (newer builds).
		{"sglang", 2, 24, SourceServerInfo + " effective_max_running_requests_per_dp"},
		// llama-server's /props: total_slots.
		{"llamacpp", 1, 12, SourceProps + " total_slots"},
		// mlx-lm: --decode-concurrency is only on its command line, which
		// an engine in this process does not have: the default.
		{"mlx", 1, 32, runningFromDefault + " 32"},
		// Ollama: OLLAMA_NUM_PARALLEL is only in its process's environment,
		// and an engine in this process has no process of its own.
		{"ollama", 1, 0, ""},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "engine.log")
			s, err := sim.Start(sim.Config{Flavor: tc.kind, Model: "Qwen/Qwen3-8B", DP: tc.dp, MaxRunning: 12,
				SingleTPS: 50, Batch16TPS: 400, LogPath: logPath}, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			var lf *enginelog.Facts
			if tc.kind == "vllm" || tc.kind == "sglang" {
				data, err := os.ReadFile(logPath)
				if err != nil {
					t.Fatal(err)
				}
				g, err := LogGrammar(tc.kind)
				if err != nil {
					t.Fatal(err)
				}
				f, err := enginelog.Read(g, bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				lf = &f
			}
			e := newClient(t, tc.kind, s.URL(), func(c *Config) { c.Log = logPath }).Facts(t.Context(), nil, lf)
			checkWire(t, e)
			wantSrc := tc.wantSrc
			if tc.wantSrc == "log" {
				wantSrc = "launch_args max_num_seqs=12"
				if tc.dp > 1 {
					wantSrc += " × 2 ranks"
				}
			}
			if e.MaxRunning != tc.want || e.MaxRunningSource != wantSrc {
				t.Errorf("max running %d from %q, want %d from %q", e.MaxRunning, e.MaxRunningSource, tc.want, wantSrc)
			}
		})
	}
}

func TestMaxRunningRules(t *testing.T) {
	h100 := wire.GPU{UUID: "GPU-1", Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30}
	a100 := wire.GPU{UUID: "GPU-2", Name: "NVIDIA A100-SXM4-80GB", MemoryTotal: 80 << 30}
	l4 := wire.GPU{UUID: "GPU-3", Name: "NVIDIA L4", MemoryTotal: 24 << 30}
	noEnv := func(string) (string, bool, error) { return "", false, nil }
	env := func(v string) func(string) (string, bool, error) {
		return func(string) (string, bool, error) { return v, true, nil }
	}
	hidden := func(string) (string, bool, error) { return "", false, errors.New("permission denied") }
	for _, tc := range []struct {
		name string
		fn   func(runningInput) (int, string)
		in   runningInput
		want int
		src  string
	}{
		{"vllm arg", vllmRunning, runningInput{args: map[string]string{"max_num_seqs": "48"}, gpus: []wire.GPU{h100}}, 48, "launch_args max_num_seqs=48"},
		{"vllm H100 default", vllmRunning, runningInput{gpus: []wire.GPU{h100, h100}}, 1024, "default 1024 (GPUs of 70 GiB or more)"},
		{"vllm A100 default", vllmRunning, runningInput{gpus: []wire.GPU{a100}}, 256, "default 256"},
		{"vllm L4 default", vllmRunning, runningInput{gpus: []wire.GPU{l4}}, 256, "default 256"},
		{"vllm mixed GPUs", vllmRunning, runningInput{gpus: []wire.GPU{h100, l4}}, 256, "default 256"},
		{"vllm GPUs unknown", vllmRunning, runningInput{}, 256, "default 256 (1024 on GPUs of 70 GiB or more; the engine's GPUs are unknown)"},
		{"vllm bad arg", vllmRunning, runningInput{args: map[string]string{"max_num_seqs": "-3"}, gpus: []wire.GPU{l4}}, 256, "default 256"},
		{"sglang arg", sglangRunning, runningInput{args: map[string]string{"max_running_requests": "64"}}, 64, "launch_args max_running_requests=64"},
		{"sglang dp attention", sglangRunning, runningInput{args: map[string]string{"max_running_requests": "64",
			"data_parallel_size": "4", "enable_dp_attention": "true"}}, 16, "launch_args max_running_requests=64 shared by the ranks (DP attention)"},
		{"sglang default is the pool's", sglangRunning, runningInput{}, 0, ""},
		{"llama.cpp -np", llamaRunning, runningInput{args: map[string]string{"parallel": "8"}}, 8, "launch_args parallel=8"},
		{"llama.cpp default unknown", llamaRunning, runningInput{}, 0, ""},
		{"ollama env", ollamaRunning, runningInput{env: env("4")}, 4, "env OLLAMA_NUM_PARALLEL=4"},
		{"ollama unset", ollamaRunning, runningInput{env: noEnv}, 1, "default 1 (OLLAMA_NUM_PARALLEL is not set)"},
		{"ollama unreadable", ollamaRunning, runningInput{env: hidden}, 0, ""},
		{"ollama garbage", ollamaRunning, runningInput{env: env("many")}, 0, ""},
		{"mlx arg", mlxRunning, runningInput{args: map[string]string{"decode_concurrency": "8"}}, 8, "launch_args decode_concurrency=8"},
	} {
		n, src := tc.fn(tc.in)
		if n != tc.want || src != tc.src {
			t.Errorf("%s: %d from %q, want %d from %q", tc.name, n, src, tc.want, tc.src)
		}
	}
}

func TestMaxRunningFromFixtures(t *testing.T) {
	// SGLang 0.4.9: /metrics has the load, /v1/loads max_running_requests
	// per rank (2048 each).
	srv := startFake(t, "sglang", nil)
	e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxRunning != 4096 || e.MaxRunningSource != SourceLoads+" max_running_requests" {
		t.Errorf("sglang: %d from %q", e.MaxRunning, e.MaxRunningSource)
	}
	// Without /v1/loads and with no per-rank figure in /server_info, the
	// pool-sized default is unknown.
	srv = startFake(t, "sglang", map[string]http.HandlerFunc{"/v1/loads": nil})
	e = newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxRunning != 0 || e.MaxRunningSource != "" {
		t.Errorf("sglang without /v1/loads: %d from %q", e.MaxRunning, e.MaxRunningSource)
	}
	srv = startFake(t, "llamacpp", nil)
	e = newClient(t, "llamacpp", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxRunning != 4 || e.MaxRunningSource != SourceProps+" total_slots" {
		t.Errorf("llama.cpp: %d from %q", e.MaxRunning, e.MaxRunningSource)
	}
	// vLLM without its log: the default, times the two ranks its metrics show.
	srv = startFake(t, "vllm", nil)
	e = newClient(t, "vllm", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxRunning != 512 || e.MaxRunningSource != "default 256 (1024 on GPUs of 70 GiB or more; the engine's GPUs are unknown) × 2 ranks" {
		t.Errorf("vllm: %d from %q", e.MaxRunning, e.MaxRunningSource)
	}
}
