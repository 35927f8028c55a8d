package sim

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The regexes come from reference/engines.md, which the agent's log
// parser is written against.

func startWithLog(t *testing.T, cfg Config) (*Server, []string) {
	t.Helper()
	cfg.LogPath = filepath.Join(t.TempDir(), "engine.log")
	s := startSim(t, cfg)
	b, err := os.ReadFile(cfg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return s, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func atoiNoCommas(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestVLLMStartLog(t *testing.T) {
	t.Parallel()
	var (
		lineRe   = regexp.MustCompile(`^\((APIServer|EngineCore(?:_DP(\d+))?) pid=\d+\) (?:INFO \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] (.*)|INFO:     (.*))$`)
		kvRe     = regexp.MustCompile(`GPU KV cache size: ([\d,]+) tokens`)
		concRe   = regexp.MustCompile(`Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x`)
		argsRe   = regexp.MustCompile(`non-default args: (\{.*\})$`)
		startRe  = regexp.MustCompile(`Starting vLLM API server 0 on (http://\S+)$`)
		versRe   = regexp.MustCompile(`vLLM API server version (\S+)$`)
		readyRe  = regexp.MustCompile(`INFO:     Application startup complete\.$`)
		anyDPRe  = regexp.MustCompile(`EngineCore_DP\d`)
		coreRe   = regexp.MustCompile(`^\(EngineCore pid=\d+\) `)
		dpRankRe = regexp.MustCompile(`EngineCore_DP(\d+)`)
	)
	for _, tc := range []struct {
		name  string
		pools []int64
	}{
		{"dp2", []int64{373696, 2925}},
		{"dp1", []int64{379088}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dp := len(tc.pools)
			s, lines := startWithLog(t, Config{SingleTPS: 60, Batch16TPS: 600, DP: dp, KVTokens: tc.pools})
			pools := map[int]int64{}
			var args, started, version string
			ready := false
			for _, l := range lines {
				if !lineRe.MatchString(l) {
					t.Errorf("line does not match the vLLM format: %q", l)
				}
				if m := kvRe.FindStringSubmatch(l); m != nil {
					rank := 0
					if r := dpRankRe.FindStringSubmatch(l); r != nil {
						rank, _ = strconv.Atoi(r[1])
					} else if !coreRe.MatchString(l) {
						t.Errorf("KV line without an engine core prefix: %q", l)
					}
					pools[rank] = atoiNoCommas(t, m[1])
				}
				if m := concRe.FindStringSubmatch(l); m != nil && atoiNoCommas(t, m[1]) != s.cfg.MaxModelLen {
					t.Errorf("concurrency line for %s tokens, max model len is %d", m[1], s.cfg.MaxModelLen)
				}
				if m := argsRe.FindStringSubmatch(l); m != nil {
					args = m[1]
				}
				if m := startRe.FindStringSubmatch(l); m != nil {
					started = m[1]
				}
				if m := versRe.FindStringSubmatch(l); m != nil {
					version = m[1]
				}
				ready = ready || readyRe.MatchString(l)
				if dp == 1 && anyDPRe.MatchString(l) {
					t.Errorf("DP=1 log has a DP rank: %q", l)
				}
			}
			for i, want := range tc.pools {
				if pools[i] != want {
					t.Errorf("rank %d pool %d in the log, want %d", i, pools[i], want)
				}
			}
			if len(pools) != dp {
				t.Errorf("pool lines for ranks %v, want %d ranks", pools, dp)
			}
			for _, want := range []string{"'model': 'Qwen/Qwen3-8B'", "'heft_sim_single_tps': 60.0", "'heft_sim_batch16_tps': 600.0",
				"'port': " + strconv.Itoa(s.port)} {
				if !strings.Contains(args, want) {
					t.Errorf("non-default args %s lack %s", args, want)
				}
			}
			if hasDP := strings.Contains(args, "'data_parallel_size': 2"); hasDP != (dp == 2) {
				t.Errorf("non-default args %s: data_parallel_size present=%v with dp=%d", args, hasDP, dp)
			}
			if started != s.URL() || version != "0.12.0" || !ready {
				t.Errorf("started=%q version=%q ready=%v", started, version, ready)
			}
		})
	}
}

func TestSGLangStartLog(t *testing.T) {
	t.Parallel()
	var (
		lineRe  = regexp.MustCompile(`^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?)((?: [A-Z_]+\d+)*)\] (.*)$`)
		kvRe    = regexp.MustCompile(`^KV Cache is allocated\. #tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB$`)
		totalRe = regexp.MustCompile(`^max_total_num_tokens=(\d+), chunked_prefill_size=\d+, max_prefill_tokens=\d+, max_running_requests=\d+, context_len=\d+, available_gpu_mem=[\d.]+ GB$`)
		loadRe  = regexp.MustCompile(`^Load weight end\. type=\w+, dtype=[\w.]+, avail mem=([\d.]+) GB, mem usage=([\d.]+) GB\.$`)
		argsRe  = regexp.MustCompile(`^server_args=ServerArgs\((.*)\)$`)
	)
	for _, tc := range []struct {
		name  string
		pools []int64
	}{
		{"dp2", []int64{24094, 2925}},
		{"dp1", []int64{24094}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dp := len(tc.pools)
			_, lines := startWithLog(t, Config{Flavor: FlavorSGLang, SingleTPS: 60, Batch16TPS: 600, DP: dp, KVTokens: tc.pools})
			kv, total := map[int]int64{}, map[int]int64{}
			var args string
			ready, loads := false, 0
			for _, l := range lines {
				m := lineRe.FindStringSubmatch(l)
				if m == nil {
					t.Errorf("line does not match the SGLang format: %q", l)
					continue
				}
				rank, msg := 0, m[3]
				if toks := strings.Fields(m[2]); len(toks) > 0 {
					if dp == 1 {
						t.Errorf("DP=1 line with rank tokens: %q", l)
					}
					rank, _ = strconv.Atoi(strings.TrimPrefix(toks[0], "DP"))
				}
				if k := kvRe.FindStringSubmatch(msg); k != nil {
					kv[rank] = atoiNoCommas(t, k[1])
				}
				if k := totalRe.FindStringSubmatch(msg); k != nil {
					total[rank] = atoiNoCommas(t, k[1])
				}
				if loadRe.MatchString(msg) {
					loads++
				}
				if a := argsRe.FindStringSubmatch(msg); a != nil {
					args = a[1]
				}
				ready = ready || msg == "The server is fired up and ready to roll!"
			}
			for i, want := range tc.pools {
				if kv[i] != want || total[i] != want {
					t.Errorf("rank %d: KV line %d, max_total_num_tokens %d; want %d", i, kv[i], total[i], want)
				}
			}
			if len(kv) != dp || loads != dp || !ready {
				t.Errorf("kv lines %v, load lines %d, ready %v", kv, loads, ready)
			}
			for _, want := range []string{"model_path='Qwen/Qwen3-8B'", "dp_size=" + strconv.Itoa(dp), "heft_sim_single_tps=60.0"} {
				if !strings.Contains(args, want) {
					t.Errorf("server_args lack %s: %s", want, args)
				}
			}
		})
	}
}

func TestMacAndLlamaStartLogs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flavor string
		re     string
		check  func(t *testing.T, s *Server, m []string)
	}{
		{FlavorMLX, `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - INFO - Starting httpd at (\S+) on port (\d+)\.\.\.$`,
			func(t *testing.T, s *Server, m []string) {
				if m[1] != "127.0.0.1" || m[2] != strconv.Itoa(s.port) {
					t.Errorf("mlx start line %q", m[0])
				}
			}},
		{FlavorLlamaCpp, `^llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells, +\d+ layers, +(\d+)/(\d+) seqs\), K \(f16\): +[\d.]+ MiB, V \(f16\): +[\d.]+ MiB$`,
			func(t *testing.T, s *Server, m []string) {
				// A split cache: each of the 16 slots' streams holds
				// 65,536/16 cells, and the line names one stream's.
				if m[1] != "4096" || m[2] != "16" || m[3] != "16" {
					t.Errorf("llama kv line %q", m[0])
				}
			}},
		{FlavorLlamaCpp, `^main: server is listening on (http://\S+) - starting the main loop$`,
			func(t *testing.T, s *Server, m []string) {
				if m[1] != s.URL() {
					t.Errorf("llama ready line %q", m[0])
				}
			}},
		{FlavorLlamaCpp, `^slot +load_model: id +(\d+) \| task -1 \| new slot, n_ctx = (\d+)$`,
			func(t *testing.T, s *Server, m []string) {
				if m[2] != "4096" {
					t.Errorf("llama slot line %q", m[0])
				}
			}},
		{FlavorOllama, `^time=\S+ level=INFO source=routes\.go:\d+ msg="Listening on (\S+) \(version (\S+)\)"$`,
			func(t *testing.T, s *Server, m []string) {
				if "http://"+m[1] != s.URL() || m[2] != "0.13.0" {
					t.Errorf("ollama listening line %q", m[0])
				}
			}},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			t.Parallel()
			s, lines := startWithLog(t, Config{Flavor: tc.flavor, SingleTPS: 60, Batch16TPS: 600, KVTokens: []int64{65536}})
			re := regexp.MustCompile(tc.re)
			found := 0
			for _, l := range lines {
				if m := re.FindStringSubmatch(l); m != nil {
					found++
					tc.check(t, s, m)
				}
			}
			if found == 0 {
				t.Errorf("no line matches %s in:\n%s", tc.re, strings.Join(lines, "\n"))
			}
		})
	}
}

// llama-server with "-np 16" and no --kv-unified splits its cache: the
// context lines say so, as llama.cpp's llama_context prints them, and the
// whole n_ctx is 16 streams of n_ctx_seq cells.
func TestLlamaStartLogSplitCache(t *testing.T) {
	t.Parallel()
	_, lines := startWithLog(t, Config{Flavor: FlavorLlamaCpp, SingleTPS: 60, Batch16TPS: 600, KVTokens: []int64{65536}})
	re := regexp.MustCompile(`^llama_context: (\w+) += (\w+)$`)
	got := map[string]string{}
	for _, l := range lines {
		if m := re.FindStringSubmatch(l); m != nil {
			got[m[1]] = m[2]
		}
	}
	for k, want := range map[string]string{"n_seq_max": "16", "n_ctx": "65536", "n_ctx_seq": "4096", "kv_unified": "false"} {
		if got[k] != want {
			t.Errorf("llama_context: %s = %q, want %q", k, got[k], want)
		}
	}
}

func TestStartLogUnwritable(t *testing.T) {
	t.Parallel()
	cfg := fast(FlavorVLLM)
	cfg.LogPath = filepath.Join(t.TempDir(), "missing-dir", "engine.log")
	if s, err := Start(cfg, "127.0.0.1:0"); err == nil {
		s.Close()
		t.Fatal("Start wrote a log into a missing directory")
	} else if !strings.Contains(err.Error(), "start-up log") {
		t.Errorf("error %q does not say what failed", err)
	}
}
