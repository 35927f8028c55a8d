package pacenoise

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

const wild = "../../testdata/pace-wild"

func TestParseLine(t *testing.T) {
	v0 := time.Date(2000, 1, 22, 18, 25, 14, 0, time.UTC)
	v1 := time.Date(2026, 5, 12, 8, 1, 59, 0, time.UTC)
	sgl := time.Date(2025, 3, 11, 1, 44, 28, 0, time.UTC)
	for _, tc := range []struct {
		name, line string
		want       []Record
	}{
		{"vLLM V0", `INFO 01-22 18:25:14 metrics.py:449] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 82.5 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 7.5%, CPU KV cache usage: 0.0%.`,
			[]Record{{Engine: EngineVLLM, Time: float64(v0.Unix()), Running: 2, GenTPS: 82.5}}},
		{"vLLM V0 wrapped", `INFO 07-03 23:23:42 [metrics.py:536] Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 616.1 tokens/s, Running: 32 r`,
			[]Record{{Engine: EngineVLLM, Time: float64(time.Date(2000, 7, 3, 23, 23, 42, 0, time.UTC).Unix()), Running: 32, GenTPS: 616.1, PromptTPS: 12.5}}},
		{"vLLM V0 two records cut by $", `INFO 07-03 23:23:53 [metrics.py:536] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 597.0 tokens/s, Running: 32 $INFO 07-03 23:23:58 [metrics.py:536] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 589.1 tokens/s, Running: 31 r`,
			[]Record{
				{Engine: EngineVLLM, Time: float64(time.Date(2000, 7, 3, 23, 23, 53, 0, time.UTC).Unix()), Running: 32, GenTPS: 597},
				{Engine: EngineVLLM, Time: float64(time.Date(2000, 7, 3, 23, 23, 58, 0, time.UTC).Unix()), Running: 31, GenTPS: 589.1},
			}},
		{"vLLM V1 with container timestamp", `2026-05-12T08:01:59.333055436Z (APIServer pid=1) INFO 05-12 08:01:59 [loggers.py:271] Engine 000: Avg prompt throughput: 3411.1 tokens/s, Avg generation throughput: 5.7 tokens/s, Running: 10 reqs, Waiting: 0 reqs, GPU KV cache usage: 74.5%, Prefix cache hit rate: 0.0%`,
			[]Record{{Engine: EngineVLLM, V1: true, Time: float64(v1.Unix()) + 0.333055436, Running: 10, GenTPS: 5.7, PromptTPS: 3411.1}}},
		{"SGLang behind a collector timestamp", `[2025-03-11 16:44:28] [2025-03-11 01:44:28 TP0] Decode batch. #running-req: 5, #token: 266823, token usage: 0.61, gen throughput (token/s): 136.01, #queue-req: 0`,
			[]Record{{Engine: EngineSGLang, Time: float64(sgl.Unix()), Running: 5, GenTPS: 136.01}}},
		{"SGLang new format", `[2025-11-11 04:28:30] Decode batch, #running-req: 2, #token: 7171, token usage: 0.04, cuda graph: True, gen throughput (token/s): 86.14, #queue-req: 0, `,
			[]Record{{Engine: EngineSGLang, Time: float64(time.Date(2025, 11, 11, 4, 28, 30, 0, time.UTC).Unix()), Running: 2, GenTPS: 86.14}}},
		{"no stats", `[2025-03-11 16:44:29] [2025-03-11 01:44:29] INFO:     10.224.73.28:56594 - "GET /metrics HTTP/1.1" 200 OK`, nil},
		{"cut before the numbers", `[2025-02-27 04:37:45 TP0] Decode batch. #running-req: 8, #token: 70604, token usage: 0.14, gen thr`, nil},
	} {
		got := ParseLine(tc.line)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// SGLang logs every 40 decode steps: an interval is 40·running/gen.
func TestSGLangInterval(t *testing.T) {
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, "[2025-02-27 04:37:%02d TP0] Decode batch. #running-req: 8, #token: 1, token usage: 0.13, gen throughput (token/s): 160.00, #queue-req: 0\n", 2*i)
	}
	s, err := Parse("sgl.log", strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine != EngineSGLang || len(s.Segments) != 1 || len(s.Segments[0]) != 8 {
		t.Fatalf("engine %q, segments %v", s.Engine, s.Segments)
	}
	if dt := s.Segments[0][3].DT; math.Abs(dt-2) > 1e-12 {
		t.Errorf("dt = %v, want 40·8/160 = 2 s", dt)
	}
}

// vllmLog is a V0 log, one line every 5 s, of running requests generating
// gen(i) tokens per second in interval i.
func vllmLog(n, running int, gen func(i int) float64) string {
	var b strings.Builder
	start := time.Date(2000, 3, 1, 10, 0, 0, 0, time.UTC)
	for i := range n {
		fmt.Fprintf(&b, "INFO %s metrics.py:449] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Swapped: 0 reqs, Pending: 0 reqs\n",
			start.Add(time.Duration(5*i)*time.Second).Format("01-02 15:04:05"), gen(i), running)
	}
	return b.String()
}

func analyse(t *testing.T, log string) map[float64]Summary {
	t.Helper()
	s, err := Parse("synthetic.log", strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	out := map[float64]Summary{}
	for _, sum := range Analyse([]*Source{s}) {
		if sum.Class == All {
			out[sum.W] = sum
		}
	}
	return out
}

func TestSteadyLogReadsNoNoise(t *testing.T) {
	sums := analyse(t, vllmLog(40, 8, func(int) float64 { return 200 }))
	for _, w := range Widths {
		s := sums[w]
		if s.Compared == 0 || s.Pairs == 0 {
			t.Errorf("W=%g: %d windows compared, %d pairs; want some", w, s.Compared, s.Pairs)
		}
		if s.Max != 0 || s.P95 != 0 || s.Slower != 0 || s.SlowPairs != 0 {
			t.Errorf("W=%g: %+v, want no deviation", w, s)
		}
	}
}

func TestDoubledSecondsPerTokenReadsSlow(t *testing.T) {
	// Intervals 15-22 generate half as fast: twice the seconds per token.
	sums := analyse(t, vllmLog(40, 8, func(i int) float64 {
		if i >= 15 && i < 23 {
			return 100
		}
		return 200
	}))
	for _, w := range []float64{10, 20} {
		s := sums[w]
		if s.Slower == 0 || s.SlowPairs == 0 {
			t.Errorf("W=%g: %+v, want slow windows and slow pairs", w, s)
		}
		if math.Abs(s.Max-1) > 1e-9 {
			t.Errorf("W=%g: max deviation %v, want 1 (twice as slow)", w, s.Max)
		}
	}
}

func TestWildLogs(t *testing.T) {
	srcs, err := ReadDir(wild)
	if err != nil {
		t.Fatal(err)
	}
	if len(srcs) != 13 {
		t.Errorf("%d logs, want 13", len(srcs))
	}
	for _, s := range srcs {
		if n := s.Intervals(); n < 5 || s.Engine == "" || s.URL == "" {
			t.Errorf("%s: %d intervals, engine %q, source %q", s.File, n, s.Engine, s.URL)
		}
	}
	got := map[string]string{}
	for _, s := range Analyse(srcs) {
		got[fmt.Sprintf("%g %s", s.W, s.Class)] = fmt.Sprintf("%d %s %s %d %d %d/%d", s.Compared, pct(s.P95), pct(s.Max), s.Slower, s.Stronger, s.SlowPairs, s.Pairs)
	}
	// The finding: steady decode never reads two-in-a-row > 15 % slower
	// over 10 s windows, nor once > 30 % slower (fleet.PaceStrong).
	if s := got["10 decode only"]; s != "35 11.0 % 13.9 % 0 0 0/28" {
		t.Errorf("decode only, W=10: %s; want none > 30 %% slower and 0 slow pairs (of 28)", s)
	}
	// The numbers a first, independent analysis of the same files gave
	// (the decode-only rows are the SGLang windows plus the vLLM windows
	// without prefill): compared, p95, max, > 15 % slower, > 30 % slower,
	// slow pairs / pairs.
	for k, want := range map[string]string{
		"5 all":           "47 33.2 % 83.1 % 4 3 1/37",
		"5 with prefill":  "6 83.1 % 83.1 % 3 3 1/5",
		"5 decode only":   "41 10.6 % 27.4 % 1 0 0/32",
		"10 all":          "46 67.3 % 108.7 % 5 4 1/37",
		"10 with prefill": "11 108.7 % 108.7 % 5 4 1/9",
		"15 all":          "18 89.1 % 89.1 % 1 1 0/14",
		"15 with prefill": "7 89.1 % 89.1 % 1 1 0/5",
		"15 decode only":  "11 22.5 % 22.5 % 0 0 0/9",
		"20 all":          "18 89.1 % 89.1 % 1 1 0/14",
		"30 all":          "0 - - 0 0 0/0",
	} {
		if got[k] != want {
			t.Errorf("%s: %s, want %s", k, got[k], want)
		}
	}
}
