package enginelog_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func readFixture(t *testing.T, kind, rel string) (enginelog.Facts, error) {
	t.Helper()
	f, err := os.Open(filepath.Join(testutil.RepoRoot(t), "testdata", rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return enginelog.Read(gram(t, kind), f)
}

func ranks(pairs ...int64) []wire.Rank {
	var out []wire.Rank
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, wire.Rank{DPRank: int(pairs[i]), KVTokens: pairs[i+1]})
	}
	return out
}

func TestReadGolden(t *testing.T) {
	tests := []struct {
		kind, file string
		ranks      []wire.Rank
		format     string
		version    string
		model      string
		ready      bool
		restarts   int
		dpSize     int
		args       map[string]string // a subset that must match
		notes      []string          // substrings, one per expected note
		// An incomplete set: the ranks expected and those missing. Zero:
		// complete, with as many ranks expected as found.
		expected int
		missing  []int
	}{
		{kind: "sglang", file: "engines/sglang-dp2-even.log", ranks: ranks(0, 24094, 1, 24037),
			format: engine.FormatSGLangMaxTotal, model: "Qwen/Qwen3-8B", ready: true, dpSize: 2,
			args: map[string]string{"dp_size": "2", "load_balance_method": "round_robin", "api_key": "None", "enable_metrics": "True", "schedule_conservativeness": "1.0"}},
		{kind: "vllm", file: "engines/vllm-dp2.log", ranks: ranks(0, 373696, 1, 373552),
			format: engine.FormatVLLMTwoLine, version: "0.12.0", model: "Qwen/Qwen3-8B", ready: true, dpSize: 2,
			args: map[string]string{"data_parallel_size": "2", "gpu_memory_utilization": "0.9"}},
		{kind: "vllm", file: "engines/vllm-single.log", ranks: ranks(0, 379088),
			format: engine.FormatVLLMMerged, version: "0.28.0", model: "Qwen/Qwen3-8B", ready: true,
			args: map[string]string{"api_key": "***", "max_model_len": "40960"}},
		{kind: "sglang", file: "logs/sglang-dp2-uneven.log", ranks: ranks(0, 24094, 1, 2925),
			format: engine.FormatSGLangMaxTotal, model: "Qwen/Qwen3-8B", ready: true, dpSize: 2},
		{kind: "sglang", file: "logs/sglang-tp2-dp2.log", ranks: ranks(0, 1123952, 1, 1122416),
			format: engine.FormatSGLangMaxTotal, model: "qwen3-moe", ready: true, dpSize: 2,
			args: map[string]string{"api_key": "***", "tp_size": "2", "cuda_graph_bs": "[1, 2, 4, 8, 16, 24, 32]",
				"json_model_override_args": `{"rope_scaling": {"type": "yarn", "factor": 4.0}}`, "lora_paths": "None"}},
		{kind: "sglang", file: "logs/sglang-mla.log", ranks: ranks(0, 614400),
			format: engine.FormatSGLangAlloc, model: "deepseek-ai/DeepSeek-V3", ready: false, dpSize: 1},
		{kind: "vllm", file: "logs/vllm-v0-blocks.log", ranks: ranks(0, 27305*16),
			format: engine.FormatVLLMBlocks, version: "0.5.4", model: "meta-llama/Meta-Llama-3.1-8B-Instruct", ready: true,
			args:  map[string]string{"block_size": "16", "allowed_origins": "['*']", "middleware": "[]", "served_model_name": "None"},
			notes: []string{"block_size from the launch args"}},
		{kind: "vllm", file: "logs/vllm-v0-cuda-blocks.log", ranks: ranks(0, 2570*32),
			format: engine.FormatVLLMBlocks, version: "0.9.2", model: "mistral-7b", ready: true,
			args:  map[string]string{"served_model_name": "['mistral-7b', 'mistral']", "chat_template_content_format": "string's", "api_key": "***"},
			notes: []string{"× 32 tokens"}},
		{kind: "vllm", file: "logs/vllm-color-workers.log", ranks: ranks(0, 1064384, 1, 1063872),
			format: engine.FormatVLLMTwoLine, version: "0.11.0", model: "Qwen/Qwen3-30B-A3B", ready: true, dpSize: 2,
			args: map[string]string{"enable_expert_parallel": "True", "tensor_parallel_size": "2"}},
		{kind: "vllm", file: "logs/vllm-crlf.log", ranks: ranks(0, 401232),
			format: engine.FormatVLLMMerged, version: "0.28.0", model: "qwen3-8b", ready: true,
			args: map[string]string{"served_model_name": "['qwen3-8b']"}},
		{kind: "vllm", file: "logs/vllm-restart.log", ranks: ranks(0, 362544),
			format: engine.FormatVLLMTwoLine, version: "0.12.0", model: "Qwen/Qwen3-8B", ready: true, restarts: 1,
			args: map[string]string{"gpu_memory_utilization": "0.88"}},
		{kind: "sglang", file: "logs/sglang-restart.log", ranks: ranks(0, 24101, 1, 24088),
			format: engine.FormatSGLangMaxTotal, model: "Qwen/Qwen3-8B", ready: false, restarts: 1, dpSize: 2,
			args: map[string]string{"random_seed": "1200931"}},
		{kind: "vllm", file: "logs/vllm-dp4-starved.log", ranks: ranks(0, 373696, 1, 373552, 2, 373600, 3, 46704),
			format: engine.FormatVLLMTwoLine, version: "0.12.0", model: "Qwen/Qwen3-8B", ready: true, dpSize: 4},
		{kind: "vllm", file: "logs/vllm-dp4-starting.log", ranks: ranks(0, 373696, 1, 373552, 2, 373600),
			format: engine.FormatVLLMTwoLine, version: "0.12.0", model: "Qwen/Qwen3-8B", dpSize: 4, expected: 4, missing: []int{3},
			notes: []string{"expected 4 data-parallel ranks (the launch args say data_parallel_size=4) but 3 printed a KV pool; none from DP 3"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f, err := readFixture(t, tc.kind, tc.file)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !slices.Equal(f.Ranks, tc.ranks) {
				t.Errorf("ranks = %v, want %v", f.Ranks, tc.ranks)
			}
			if f.Engine != tc.kind || f.Format != tc.format || f.Version != tc.version || f.Model != tc.model ||
				f.Ready != tc.ready || f.Restarts != tc.restarts || f.Startups != tc.restarts+1 || f.DPSize != tc.dpSize {
				t.Errorf("got engine=%q format=%q version=%q model=%q ready=%v restarts=%d startups=%d dp=%d\n"+
					"want engine=%q format=%q version=%q model=%q ready=%v restarts=%d startups=%d dp=%d",
					f.Engine, f.Format, f.Version, f.Model, f.Ready, f.Restarts, f.Startups, f.DPSize,
					tc.kind, tc.format, tc.version, tc.model, tc.ready, tc.restarts, tc.restarts+1, tc.dpSize)
			}
			for k, want := range tc.args {
				if got, ok := f.LaunchArgs[k]; !ok || got != want {
					t.Errorf("launch arg %s = %q (present %v), want %q", k, got, ok, want)
				}
			}
			if len(f.Notes) != len(tc.notes) {
				t.Errorf("notes = %q, want %d notes like %q", f.Notes, len(tc.notes), tc.notes)
			}
			for i, n := range tc.notes {
				if i < len(f.Notes) && !strings.Contains(f.Notes[i], n) {
					t.Errorf("note %d = %q, want it to contain %q", i, f.Notes[i], n)
				}
			}
			if f.FromPreviousFile {
				t.Error("FromPreviousFile set on a plain read")
			}
			wantExpected, wantComplete := tc.expected, tc.missing == nil
			if wantExpected == 0 {
				wantExpected = len(tc.ranks)
			}
			if f.ExpectedRanks != wantExpected || f.Complete != wantComplete || !slices.Equal(f.MissingRanks, tc.missing) {
				t.Errorf("expected %d complete %v missing %v; want %d %v %v", f.ExpectedRanks, f.Complete, f.MissingRanks, wantExpected, wantComplete, tc.missing)
			}
		})
	}
}

func TestReadNoPools(t *testing.T) {
	f, err := readFixture(t, "vllm", "logs/vllm-no-pool.log")
	if !errors.Is(err, enginelog.ErrNoPools) {
		t.Fatalf("err = %v, want enginelog.ErrNoPools", err)
	}
	// It names the kind's own pool lines (the other kind's hint is
	// TestReadWrongEngineHints').
	for _, want := range []string{"GPU KV cache size", "# cuda blocks", "# GPU blocks", "8 lines"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// What the log did tell is still returned.
	if f.Version != "0.28.0" || f.Model != "meta-llama/Llama-3.1-70B-Instruct" || len(f.Ranks) != 0 || f.Ready {
		t.Errorf("facts = %+v", f)
	}
}

func TestReadWrongEngineHints(t *testing.T) {
	_, err := readFixture(t, "vllm", "engines/sglang-dp2-even.log")
	if !errors.Is(err, enginelog.ErrNoPools) || !strings.Contains(err.Error(), `try engine "sglang"`) {
		t.Fatalf("err = %v, want enginelog.ErrNoPools with a hint", err)
	}
	_, err = readFixture(t, "sglang", "engines/vllm-dp2.log")
	if !errors.Is(err, enginelog.ErrNoPools) || !strings.Contains(err.Error(), `try engine "vllm"`) {
		t.Fatalf("err = %v, want enginelog.ErrNoPools with a hint", err)
	}
}

func TestReadUnknownEngine(t *testing.T) {
	for _, kind := range []string{"mlx", "", "tgi"} {
		if _, err := engine.LogGrammar(kind); !errors.Is(err, enginelog.ErrUnknownEngine) || !strings.Contains(err.Error(), "vllm") {
			t.Errorf("LogGrammar(%q) err = %v, want ErrUnknownEngine naming the kinds heft reads", kind, err)
		}
	}
	if _, err := enginelog.Read(nil, strings.NewReader("")); !errors.Is(err, enginelog.ErrUnknownEngine) {
		t.Errorf("Read(nil) err = %v, want ErrUnknownEngine", err)
	}
	if _, err := enginelog.Read(gram(t, " VLLM "), strings.NewReader("")); !errors.Is(err, enginelog.ErrNoPools) {
		t.Errorf("kind is matched case-insensitively: err = %v", err)
	}
}

func TestReadEmpty(t *testing.T) {
	_, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(""))
	if !errors.Is(err, enginelog.ErrNoPools) || !strings.Contains(err.Error(), "0 lines") {
		t.Fatalf("err = %v", err)
	}
}

type failingReader struct{ err error }

func (r failingReader) Read([]byte) (int, error) { return 0, r.err }

func TestReadError(t *testing.T) {
	boom := errors.New("disk on fire")
	_, err := enginelog.Read(gram(t, "vllm"), failingReader{boom})
	if !errors.Is(err, boom) || errors.Is(err, enginelog.ErrNoPools) {
		t.Fatalf("err = %v, want the reader's error", err)
	}
}

// A pool line far down a log behind a huge line is still found, and the
// huge line does not break the lines after it.
func TestReadSurvivesHugeLine(t *testing.T) {
	log := "[2026-03-02 10:15:01] " + strings.Repeat("noise ", 400_000) + "\n" +
		"[2026-03-02 10:15:21 DP0] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB\n"
	f, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(log))
	if err != nil || !slices.Equal(f.Ranks, ranks(0, 1000)) {
		t.Fatalf("facts %+v, err %v", f, err)
	}
}
