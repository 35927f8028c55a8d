package bench

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Abs(b) }

func TestTrueCapacity(t *testing.T) {
	for _, tc := range []struct {
		name        string
		cal         Calibration
		concurrency int
		want        float64
	}{
		// One rank: the calibration points themselves.
		{"sixteen on one rank is S16", Calibration{SingleTPS: 150, Batch16TPS: 2000}, 16, 2000},
		{"one alone is S1", Calibration{SingleTPS: 150, Batch16TPS: 2000}, 1, 150},
		// Two ranks of 80/900: each rank runs 8; t0 + 8k with
		// k = (16/900 − 1/80)/15 and t0 = 1/80 − k.
		{"dp2 splits the burst", Calibration{SingleTPS: 80, Batch16TPS: 900, DP: 2}, 16,
			16 / (1.0/80 - (16.0/900-1.0/80)/15 + 8*(16.0/900-1.0/80)/15)},
		// An odd burst: the rank with 9 of 17 sets the pace.
		{"uneven split waits for the fuller rank", Calibration{SingleTPS: 80, Batch16TPS: 900, DP: 2}, 17,
			17 / (1.0/80 - (16.0/900-1.0/80)/15 + 9*(16.0/900-1.0/80)/15)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cal.TrueCapacity(tc.concurrency); !near(got, tc.want, 1e-9) {
				t.Errorf("TrueCapacity(%d) = %v, want %v", tc.concurrency, got, tc.want)
			}
		})
	}
	// DP=2 beats one rank but is not twice S16: each rank runs half a batch.
	dp2 := Calibration{SingleTPS: 80, Batch16TPS: 900, DP: 2}.TrueCapacity(16)
	if dp2 <= 900 || dp2 >= 1800 {
		t.Errorf("dp2 capacity %v should lie between S16 and 2×S16", dp2)
	}
}

func TestColdBurstSeconds(t *testing.T) {
	c := Calibration{SingleTPS: 100, Batch16TPS: 1600} // step of 16 = 10 ms
	warm := c.IdealBurstSeconds(16, 100)
	if !near(warm, 1.0, 1e-9) {
		t.Fatalf("ideal burst = %v s, want 1", warm)
	}
	if got := c.ColdBurstSeconds(16, 100, Cold{Factor: 3, Seconds: 10}, 0); !near(got, 3, 1e-9) {
		t.Errorf("all-cold burst = %v s, want 3", got)
	}
	if got := c.ColdBurstSeconds(16, 100, Cold{Factor: 3, Seconds: 10}, 20); !near(got, 1, 1e-9) {
		t.Errorf("burst after the cold period = %v s, want 1", got)
	}
	// Cold for 0.3 s: 10 steps of 30 ms, then 90 warm steps of 10 ms.
	if got := c.ColdBurstSeconds(16, 100, Cold{Factor: 3, Seconds: 0.3}, 0); !near(got, 1.2, 1e-6) {
		t.Errorf("partly cold burst = %v s, want 1.2", got)
	}
}

func TestSummaryAndVerdicts(t *testing.T) {
	s := Summarize([]float64{1.01, 0.97, 0.99})
	if s.Median != 0.99 || s.Min != 0.97 || s.Max != 1.01 {
		t.Fatalf("Summarize = %+v", s)
	}
	if got := s.FormatPct(1); got != "−1.0 % (−3.0–+1.0)" {
		t.Errorf("FormatPct = %q", got)
	}
	if got := within(s, 0.02); got != "pass (1 of 3 runs outside)" {
		t.Errorf("within ±2 %% = %q", got)
	}
	if got := within(Summarize([]float64{0.95}), 0.02); got != "miss by 3.0 pp" {
		t.Errorf("within of a 5 %% error = %q", got)
	}
	if got := atMost(Summarize([]float64{1.2, 1.0}), 1.1, 2, ""); got != "pass (1 of 2 runs outside)" {
		t.Errorf("atMost = %q", got)
	}
	if got := atMost(Summary{}, 1, 1, ""); !strings.HasPrefix(got, "miss") {
		t.Errorf("an unmeasured value must not pass: %q", got)
	}
	if got := Summarize(nil).Format(1); got != "n/a" {
		t.Errorf("empty summary = %q", got)
	}
	if got := num(1234567.891, 1); got != "1,234,567.9" {
		t.Errorf("num = %q", got)
	}
	xs := make([]float64, 200)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	if p50, p99 := Percentile(xs, 50), Percentile(xs, 99); p50 != 100 || p99 != 198 {
		t.Errorf("p50, p99 of 1..200 = %v, %v", p50, p99)
	}
}

func TestTableMarkdown(t *testing.T) {
	tb := Table{Columns: []string{"a", "b"}}
	tb.Add("x|y", "1")
	tb.Add("only one")
	want := "| a | b |\n| --- | --- |\n| x\\|y | 1 |\n| only one |  |\n"
	if got := tb.Markdown(); got != want {
		t.Errorf("Markdown =\n%s\nwant\n%s", got, want)
	}
}

func TestReadProcSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc on this system")
	}
	st, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.RSS == 0 || st.HWM < st.RSS {
		t.Errorf("RSS %d, HWM %d: want 0 < RSS <= HWM", st.RSS, st.HWM)
	}
	// Burn a little CPU and see utime+stime move.
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	st2, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st2.CPU <= st.CPU {
		t.Errorf("CPU time did not grow after a busy loop (%v → %v, %d iterations)", st.CPU, st2.CPU, x)
	}
	if _, err := readProc(-1); err == nil {
		t.Error("reading a process that does not exist should fail")
	}
}
