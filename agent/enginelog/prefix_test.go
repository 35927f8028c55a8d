package enginelog_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/testutil"
)

// fixtureKinds maps every engine log fixture to the engine that wrote it.
func fixtureKinds(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, pattern := range []string{"testdata/engines/*.log", "testdata/logs/*.log"} {
		paths, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			kind := "vllm"
			if strings.HasPrefix(filepath.Base(p), "sglang") {
				kind = "sglang"
			}
			out[p] = kind
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d fixtures found", len(out))
	}
	return out
}

// junk is text no wrapper heft knows would put before a line: random
// printable ASCII ending in a separator, as a wrapper's prefix ends.
func junk(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(48) {
		b.WriteByte(byte(0x20 + r.IntN(0x7f-0x20)))
	}
	seps := []string{" ", "\t", ": ", "| ", "] ", "> ", " - "}
	b.WriteString(seps[r.IntN(len(seps))])
	return b.String()
}

// Every fixture, each line behind random junk, gives exactly the facts of
// the raw log: a wrapper heft does not know can never shift a rank.
func TestUnknownPrefixNeverShiftsARank(t *testing.T) {
	for path, kind := range fixtureKinds(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want, wantErr := enginelog.Read(gram(t, kind), strings.NewReader(string(raw)))
			for seed := range uint64(20) {
				r := rand.New(rand.NewPCG(seed, 7))
				var b strings.Builder
				for _, line := range strings.Split(string(raw), "\n") {
					b.WriteString(junk(r) + line + "\n")
				}
				got, err := enginelog.Read(gram(t, kind), strings.NewReader(b.String()))
				if (err == nil) != (wantErr == nil) {
					t.Fatalf("seed %d: err %v, raw err %v", seed, err, wantErr)
				}
				if d := factsDiff(got, want); d != "" {
					t.Fatalf("seed %d: %s", seed, d)
				}
			}
		})
	}
}

// factsDiff names the first fact that differs, or "".
func factsDiff(got, want enginelog.Facts) string {
	switch {
	case !slices.Equal(got.Ranks, want.Ranks):
		return fmt.Sprintf("ranks %v, want %v", got.Ranks, want.Ranks)
	case got.ExpectedRanks != want.ExpectedRanks || got.Complete != want.Complete || !slices.Equal(got.MissingRanks, want.MissingRanks):
		return fmt.Sprintf("expected %d complete %v missing %v, want %d %v %v",
			got.ExpectedRanks, got.Complete, got.MissingRanks, want.ExpectedRanks, want.Complete, want.MissingRanks)
	case got.Format != want.Format || got.Version != want.Version || got.Model != want.Model || got.Ready != want.Ready ||
		got.Restarts != want.Restarts || got.DPSize != want.DPSize || len(got.LaunchArgs) != len(want.LaunchArgs):
		return fmt.Sprintf("facts\n got %+v\nwant %+v", got, want)
	case !slices.Equal(got.Notes, want.Notes):
		return fmt.Sprintf("notes %q, want %q", got.Notes, want.Notes)
	}
	return ""
}

func TestParseLineBehindWrappers(t *testing.T) {
	tests := []struct {
		name, kind, line string
		dp, tp           int
		tokens           int64
	}{
		{"CRI", "vllm", "2026-03-02T10:00:38.123456789Z stdout F (EngineCore_DP3 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 46,704 tokens", 3, -1, 46704},
		{"syslog", "vllm", "Mar  2 10:00:38 gpu-a vllm[4242]: (EngineCore_DP1 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 7 tokens", 1, -1, 7},
		{"glued junk before the prefix", "vllm", "xx(EngineCore_DP2 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 7 tokens", 2, -1, 7},
		{"junk holding a parenthesis", "vllm", "(ctr 7) (Worker_DP1_TP1 pid=9) INFO 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 9 tokens", 1, 1, 9},
		{"CRI, SGLang", "sglang", "2026-03-02T10:15:21.1Z stderr F [2026-03-02 10:15:21 DP1] max_total_num_tokens=2925, chunked_prefill_size=2048", 1, -1, 2925},
		{"journald ISO, SGLang", "sglang", "2026-03-02T10:15:21+0000 gpu-a python3[88]: [2026-03-02 10:15:21 TP1 DP1] KV Cache is allocated. #tokens: 5, K size: 1 GB", 1, 1, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, ok := enginelog.ParseLine(gram(t, tc.kind), tc.line)
			if !ok || ev.Kind != enginelog.EventPool || ev.DPRank != tc.dp || ev.TPRank != tc.tp || ev.KVTokens != tc.tokens {
				t.Fatalf("ok=%v %+v, want DP%d TP%d %d tokens", ok, ev, tc.dp, tc.tp, tc.tokens)
			}
		})
	}
	// A process prefix in the message, after vLLM's header, is the
	// message's, not the line's.
	ev, ok := enginelog.ParseLine(gram(t, "vllm"), "(EngineCore_DP1 pid=9) INFO 12-11 00:06:53 [core.py:1] GPU KV cache size: 9 tokens (EngineCore_DP5 pid=2) ")
	if !ok || ev.DPRank != 1 {
		t.Fatalf("ok=%v %+v", ok, ev)
	}
}

func TestExpectedRanks(t *testing.T) {
	vpool := func(dp, n int) string {
		return vll(fmt.Sprintf("(EngineCore_DP%d pid=%d) ", dp, 10+dp), fmt.Sprintf("GPU KV cache size: %d tokens", n))
	}
	vargs := func(dp int) string {
		return fmt.Sprintf("(APIServer pid=1) INFO 12-11 09:13:58 [utils.py:253] non-default args: {'model': 'm', 'data_parallel_size': %d}", dp)
	}
	spool := func(dp, n int) string {
		return sgl(fmt.Sprintf(" DP%d", dp), fmt.Sprintf("max_total_num_tokens=%d, chunked_prefill_size=1", n))
	}
	tests := []struct {
		name     string
		kind     string
		lines    []string
		expected int
		complete bool
		missing  []int
		from     string
	}{
		{"all four ranks", "vllm", []string{vargs(4), vpool(0, 9), vpool(1, 9), vpool(2, 9), vpool(3, 9)}, 4, true, nil, "data_parallel_size=4"},
		{"launch args promise four", "vllm", []string{vargs(4), vpool(0, 9)}, 4, false, []int{1, 2, 3}, "data_parallel_size=4"},
		{"a DP3 line without a pool", "vllm", []string{vpool(0, 9), vpool(1, 9), vpool(2, 9),
			"(EngineCore_DP3 pid=13) INFO 12-11 09:14:19 [gpu_model_runner.py:3467] Starting to load model m..."}, 4, false, []int{3}, "prefixed DP3"},
		{"a DP3 progress bar", "vllm", []string{vpool(0, 9), "(EngineCore_DP3 pid=13) Loading safetensors checkpoint shards:   0% Completed"}, 4, false, []int{1, 2, 3}, "prefixed DP3"},
		{"a gap", "sglang", []string{spool(0, 9), spool(2, 9)}, 3, false, []int{1}, "prefixed DP2"},
		{"sglang DP marker", "sglang", []string{spool(0, 9), sgl(" DP1 TP0", "Load weight begin. avail mem=21.87 GB")}, 2, false, []int{1}, "prefixed DP1"},
		{"sglang dp_size", "sglang", []string{sgl("", "server_args=ServerArgs(model_path='m', dp_size=2)"), spool(0, 9), spool(1, 9)}, 2, true, nil, "dp_size=2"},
		{"command line echo", "sglang", []string{"+ python -m sglang.launch_server --model-path m --dp-size 4 --port 30000", spool(0, 9), spool(1, 9)}, 4, false, []int{2, 3}, "command line"},
		{"command line with =", "vllm", []string{"$ vllm serve m --data-parallel-size=2", vpool(0, 9)}, 2, false, []int{1}, "command line"},
		{"vllm -dp", "vllm", []string{"exec vllm serve m -dp 3 --port 8000", vpool(0, 9), vpool(1, 9), vpool(2, 9)}, 3, true, nil, "command line"},
		{"local size is not the size", "vllm", []string{"vllm serve m --data-parallel-size-local 2", vpool(0, 9)}, 1, true, nil, "prefixed DP0"},
		{"single engine", "vllm", []string{vll("(EngineCore pid=3) ", "GPU KV cache size: 9 tokens")}, 1, true, nil, "a pool for DP0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustFacts(t, feed(t, tc.kind, tc.lines...))
			if f.ExpectedRanks != tc.expected || f.Complete != tc.complete || !slices.Equal(f.MissingRanks, tc.missing) || !strings.Contains(f.ExpectedFrom, tc.from) {
				t.Fatalf("expected %d complete %v missing %v from %q; want %d %v %v %q",
					f.ExpectedRanks, f.Complete, f.MissingRanks, f.ExpectedFrom, tc.expected, tc.complete, tc.missing, tc.from)
			}
			// A log that names DP ranks but gives no DP size cannot say how
			// many ranks there are: that is said instead.
			hasNote := strings.Contains(strings.Join(f.Notes, "|"), "printed a KV pool; none from DP") || f.RankCountUnknown != ""
			if hasNote == tc.complete {
				t.Errorf("notes %q", f.Notes)
			}
		})
	}
}

// Rank markers and command-line sizes belong to the start-up they were
// printed in: a restart with fewer ranks is complete.
func TestExpectedRanksAcrossRestarts(t *testing.T) {
	spool := func(dp, n int) string {
		return sgl(fmt.Sprintf(" DP%d", dp), fmt.Sprintf("max_total_num_tokens=%d, chunked_prefill_size=1", n))
	}
	args := func(dp int) string {
		return sgl("", fmt.Sprintf("server_args=ServerArgs(model_path='m', dp_size=%d)", dp))
	}
	tr := feed(t, "sglang", "launch --dp-size 4", args(4), spool(0, 9), spool(1, 9), spool(2, 9), spool(3, 9),
		"launch --dp-size 2", args(2), spool(0, 8), spool(1, 8))
	f := mustFacts(t, tr)
	if f.Restarts != 1 || f.ExpectedRanks != 2 || !f.Complete {
		t.Fatalf("%+v", f)
	}
	// The echo of the next start came before its args: it is that start's.
	tr.Feed("launch --dp-size 3")
	if f := mustFacts(t, tr); f.ExpectedRanks != 2 || !f.Complete {
		t.Fatalf("echo applied to the running start-up: %+v", f)
	}
	tr.Feed(args(1))
	tr.Feed(spool(0, 7))
	if f := mustFacts(t, tr); f.ExpectedRanks != 3 || f.Complete || !slices.Equal(f.MissingRanks, []int{1, 2}) {
		t.Fatalf("third start-up: %+v", f)
	}
}
