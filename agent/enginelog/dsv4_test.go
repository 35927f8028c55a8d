package enginelog_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/shared/wire"
)

// SGLang's DeepSeek-V4 pool configurator prints its full-attention pool
// in lines of its own; a rank that prints no max_total_num_tokens (a log
// cut before it, a DP-attention rank) still shows its pool there.
func TestDSv4PoolLines(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(wildDir, "sglang-dsv4-multinode-tp3.log"))
	if err != nil {
		t.Fatal(err)
	}
	cut, _, ok := strings.Cut(string(text), "[2026-09-11 23:46:49 TP0 EP0] max_total_num_tokens=")
	if !ok {
		t.Fatal("fixture changed")
	}
	tests := []struct {
		name, log string
		ranks     []wire.Rank
		format    string
	}{
		// Printed twice, profiled then clamped to --max-total-tokens: the
		// second is the pool, not a TP rank that disagrees.
		{"pool sizes, resized", cut, ranks(0, 2999808), engine.FormatSGLangDSv4},
		{"max_total_num_tokens first", string(text), ranks(0, 2999808), engine.FormatSGLangMaxTotal},
		// Upstream's line, as quoted from a real log.
		{"memory calculation only", "[2026-05-15 09:09:53 TP0] DSv4 memory calculation: bytes_per_full_token=15955.85, available_bytes=19.58 GB, full_token=1317632\n",
			ranks(0, 1317632), engine.FormatSGLangDSv4Memory},
		{"DP attention: DP1 shows its own", strings.Join([]string{
			"[2026-09-11 23:34:03] server_args={'model_path': 'm', 'dp_size': 2, 'enable_dp_attention': True, 'port': 30000}",
			"[2026-09-11 23:46:11 DP1 TP1 EP1] DSV4 pool sizes: full=5000, swa=13312, c4=1250, c128=39, c4_state=1664, c128_state=0",
			"[2026-09-11 23:46:49 DP0 TP0 EP0] max_total_num_tokens=6000, chunked_prefill_size=1024",
		}, "\n"), ranks(0, 6000, 1, 5000), engine.FormatSGLangMaxTotal + "," + engine.FormatSGLangDSv4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(tc.log))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.Ranks, tc.ranks) || f.Format != tc.format || !f.Complete {
				t.Errorf("ranks %v format %q complete %v, want %v %q complete", f.Ranks, f.Format, f.Complete, tc.ranks, tc.format)
			}
			for _, n := range f.Notes {
				if strings.Contains(n, "disagree") {
					t.Errorf("note %q", n)
				}
			}
		})
	}
}

// 2026 SGLang prints its server args as a dict.
func TestSGLangServerArgsDict(t *testing.T) {
	log := "[2026-09-11 23:34:03] server_args={'model_path': '/models/DeepSeek-V4.1-Flash', 'served_model_name': 'deepseek-v4.1-flash', " +
		"'dist_init_addr': '192.168.123.103:20000', 'nnodes': 3, 'node_rank': 0, 'tp_size': 3, 'dp_size': 1, 'port': 8888}\n" +
		"[2026-09-11 23:46:49 TP0 EP0] max_total_num_tokens=2999808, chunked_prefill_size=1024\n"
	f, err := enginelog.Read(gram(t, "sglang"), strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if f.Model != "deepseek-v4.1-flash" || f.LaunchArgs["dist_init_addr"] != "192.168.123.103:20000" || f.DPSize != 1 ||
		f.MultiNode != "nnodes=3, node_rank=0" || !f.Complete {
		t.Errorf("facts %+v", f)
	}
}
