package engine

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name      string
		kind      string
		file      string
		wantLoad  wire.Load
		wantRanks []wire.Rank
		models    []string
	}{
		{
			name: "vllm dp2 per engine label, cache_config_info ignored",
			kind: "vllm", file: "engines/vllm-dp2-metrics.txt",
			wantLoad: wire.Load{Known: true, Running: 14, Waiting: 0, KVUsage: 0.03082719643774619, Ranks: []wire.RankLoad{
				{DPRank: 0, Running: 8, Waiting: 0, KVUsage: 0.03082719643774619},
				{DPRank: 1, Running: 6, Waiting: 0, KVUsage: 0.025656401250696022},
			}},
			wantRanks: nil, // num_gpu_blocks is a DP sum: never a pool per rank
			models:    []string{"Qwen/Qwen3-8B"},
		},
		{
			name: "vllm v0 old kv name, no engine label",
			kind: "vllm", file: "metrics/vllm-v0-old-names.txt",
			wantLoad: wire.Load{Known: true, Running: 3, Waiting: 5, KVUsage: 0.4375, Ranks: []wire.RankLoad{
				{DPRank: 0, Running: 3, Waiting: 5, KVUsage: 0.4375}}},
			models: []string{"meta-llama/Llama-3.1-8B-Instruct"},
		},
		{
			name: "sglang dp2 uneven pools from max_total_num_tokens",
			kind: "sglang", file: "engines/sglang-dp2-uneven-metrics.txt",
			wantLoad: wire.Load{Known: true, Running: 9, Waiting: 6, KVUsage: 0.9504273504273504, Ranks: []wire.RankLoad{
				{DPRank: 0, Running: 7, Waiting: 0, KVUsage: 0.37158628704241717},
				{DPRank: 1, Running: 2, Waiting: 6, KVUsage: 0.9504273504273504},
			}},
			wantRanks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}},
			models:    []string{"Qwen/Qwen3-8B"},
		},
		{
			name: "sglang dp1 has no dp_rank label",
			kind: "sglang", file: "metrics/sglang-dp1.txt",
			wantLoad: wire.Load{Known: true, Running: 4, Waiting: 1, KVUsage: 0.12, Ranks: []wire.RankLoad{
				{DPRank: 0, Running: 4, Waiting: 1, KVUsage: 0.12}}},
			wantRanks: []wire.Rank{{DPRank: 0, KVTokens: 95000}},
			models:    []string{"Qwen/Qwen3-8B"},
		},
		{
			name: "sglang tp ranks all export: one value per dp rank, not a sum",
			kind: "sglang", file: "metrics/sglang-dp2-tp2-all-schedulers.txt",
			wantLoad: wire.Load{Known: true, Running: 8, Waiting: 2, Ranks: []wire.RankLoad{
				{DPRank: 0, Running: 5}, {DPRank: 1, Running: 3, Waiting: 2}}},
			wantRanks: []wire.Rank{{DPRank: 0, KVTokens: 120000}, {DPRank: 1, KVTokens: 118000}},
			models:    []string{"Qwen/Qwen3-32B"},
		},
		{
			name: "llama.cpp processing and deferred",
			kind: "llamacpp", file: "metrics/llamacpp.txt",
			wantLoad: wire.Load{Known: true, Running: 2, Waiting: 3, Ranks: []wire.RankLoad{{DPRank: 0, Running: 2, Waiting: 3}}},
		},
		{
			name: "llama.cpp older kv ratio",
			kind: "llamacpp", file: "metrics/llamacpp-old-kv.txt",
			wantLoad: wire.Load{Known: true, Running: 1, KVUsage: 0.25, Ranks: []wire.RankLoad{{DPRank: 0, Running: 1, KVUsage: 0.25}}},
		},
		{
			name: "hostile values are dropped, usage clamped",
			kind: "vllm", file: "metrics/vllm-hostile-values.txt",
			wantLoad: wire.Load{Known: true, Running: 2, KVUsage: 1, Ranks: []wire.RankLoad{{DPRank: 4, Running: 2, KVUsage: 1}}},
			models:   []string{"m"},
		},
		{
			name: "another engine's page: parses, nothing known",
			kind: "vllm", file: "engines/sglang-dp2-uneven-metrics.txt",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(tt.kind, bytes.NewReader(testutil.ReadTestdata(t, tt.file)))
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			if !reflect.DeepEqual(got.Load, tt.wantLoad) {
				t.Errorf("load\n got %+v\nwant %+v", got.Load, tt.wantLoad)
			}
			if !reflect.DeepEqual(got.Ranks, tt.wantRanks) {
				t.Errorf("ranks got %+v want %+v", got.Ranks, tt.wantRanks)
			}
			if !reflect.DeepEqual(got.Models, tt.models) {
				t.Errorf("models got %v want %v", got.Models, tt.models)
			}
			if got.Families == 0 {
				t.Error("no families counted")
			}
		})
	}
}

func TestParseMetricsErrors(t *testing.T) {
	tests := []struct {
		name, kind string
		body       []byte
		want       string
	}{
		{"truncated line", "vllm", testutil.ReadTestdata(t, "metrics/bad-truncated.txt"), "metrics do not parse"},
		{"type declared twice", "vllm", testutil.ReadTestdata(t, "metrics/bad-type-conflict.txt"), "metrics do not parse"},
		{"json error page", "llamacpp", testutil.ReadTestdata(t, "metrics/bad-json.txt"), "metrics do not parse"},
		{"html login page", "sglang", testutil.ReadTestdata(t, "http/bad/login.html"), "HTML"},
		{"too large", "vllm", bytes.Repeat([]byte("# comment line\n"), MaxBodyBytes/15+2), "larger than 8 MiB"},
		{"mlx has no metrics", "mlx", []byte(""), "no /metrics"},
		{"unknown kind", "no-such-engine", []byte(""), "unknown engine kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseMetrics(tt.kind, bytes.NewReader(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := ParseMetrics("ollama", strings.NewReader("")); !errors.Is(err, ErrNoMetrics) {
		t.Errorf("ollama: err = %v, want ErrNoMetrics", err)
	}
}

// Series whose every sample is unusable (NaN, negative, a rank label
// that is no number) are not a reading: the load is not known and says it
// cannot be read (a busy engine must not look idle), and a counter so
// written is not known (a probe must not take 0 for its count).
func TestUnusableSeriesAreNotReadings(t *testing.T) {
	for name, value := range map[string]string{
		"rank label no number": `{engine="core-0"} 12`,
		"NaN":                  `{engine="0"} NaN`,
		"negative":             `{engine="0"} -3`,
	} {
		t.Run(name, func(t *testing.T) {
			page := "vllm:num_requests_running" + value + "\nvllm:num_requests_waiting" + value + "\nvllm:generation_tokens_total" + value + "\n"
			got, err := ParseMetrics("vllm", strings.NewReader(page))
			if err != nil {
				t.Fatal(err)
			}
			if got.Load.Known || !got.LoadUnreadable || got.GeneratedKnown {
				t.Fatalf("load %+v, unreadable %v, generated known %v: want unknown, unreadable, not known", got.Load, got.LoadUnreadable, got.GeneratedKnown)
			}
			if _, err := got.LoadOf(); err == nil {
				t.Fatal("LoadOf gave no error")
			}
		})
	}
	got, err := ParseMetrics("vllm", strings.NewReader("vllm:cache_config_info{block_size=\"16\"} 1\n"))
	if err != nil || got.LoadUnreadable || got.Load.Known {
		t.Fatalf("a page without load series: %+v, %v; want unknown, not unreadable", got.Load, err)
	}
}

// FuzzParseMetrics checks that no page, however broken, panics the reader
// or yields facts the wire would refuse. Seeds: every metrics fixture,
// plus the corpus in testdata/fuzz/FuzzParseMetrics.
func FuzzParseMetrics(f *testing.F) {
	for _, dir := range []string{"engines", "metrics"} {
		files, _ := filepath.Glob(filepath.Join(testutil.Testdata(f, dir), "*.txt"))
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			for _, kind := range []string{"vllm", "sglang", "llamacpp"} {
				f.Add(kind, b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, kind string, page []byte) {
		got, err := ParseMetrics(kind, bytes.NewReader(page))
		if err != nil {
			return
		}
		if err := got.Load.Validate(); err != nil {
			t.Fatalf("load the wire refuses: %v (%+v)", err, got.Load)
		}
		if err := wire.CheckRanks(got.Ranks); err != nil {
			t.Fatalf("ranks the wire refuses: %v", err)
		}
		if got.Load.KVUsage > 1 || math.IsNaN(got.Load.KVUsage) {
			t.Fatalf("kv usage %v outside 0..1", got.Load.KVUsage)
		}
		for i, r := range got.Load.Ranks {
			if i > 0 && r.DPRank <= got.Load.Ranks[i-1].DPRank {
				t.Fatalf("load ranks not sorted: %+v", got.Load.Ranks)
			}
		}
		if !got.Load.Known && (got.Load.Running != 0 || got.Load.Waiting != 0) {
			t.Fatalf("counts without Known: %+v", got.Load)
		}
	})
}

func BenchmarkParseMetrics(b *testing.B) {
	page := testutil.ReadTestdata(b, "engines/sglang-dp2-uneven-metrics.txt")
	b.SetBytes(int64(len(page)))
	for b.Loop() {
		if _, err := ParseMetrics("sglang", bytes.NewReader(page)); err != nil {
			b.Fatal(err)
		}
	}
}

// The prompt tokens vLLM computed are those it read less its prefix
// cache's hits, under whichever name its version counts them: 0.10 on
// prefix_cache_hits (and the deprecated gpu_ name beside it, read once),
// 0.9 gpu_prefix_cache_hits in tokens, 0.8 the same name in blocks of
// cache_config_info's block_size (16 where the page does not say).
func TestVLLMPrefixCacheHitsByVersion(t *testing.T) {
	const (
		prompt   = "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 10000\n"
		newHits  = "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 3000\n"
		tokHits  = "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached tokens.\n# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 3000\n"
		blkHits  = "# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached blocks.\n# TYPE vllm:gpu_prefix_cache_hits_total counter\nvllm:gpu_prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 200\n"
		info32   = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\"} 1.0\n"
		infoNone = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"None\",enable_prefix_caching=\"True\"} 1.0\n"
	)
	tests := []struct {
		name string
		page string
		want float64
	}{
		{"no prefix cache counter", prompt, 10000},
		{"0.10: prefix_cache_hits beside the deprecated name", prompt + newHits + tokHits, 7000},
		{"0.9: gpu_prefix_cache_hits in tokens", prompt + tokHits, 7000},
		{"0.8: in blocks of cache_config_info's size", prompt + blkHits + info32, 10000 - 200*32},
		{"0.8: in blocks, no usable block size", prompt + blkHits + infoNone, 10000 - 200*16},
	}
	for _, tc := range tests {
		f, err := ParseMetrics(wire.EngineVLLM, strings.NewReader(tc.page))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !f.PromptKnown || f.PromptComputed != tc.want {
			t.Errorf("%s: prompt computed %v (known %v), want %v", tc.name, f.PromptComputed, f.PromptKnown, tc.want)
		}
	}
}
