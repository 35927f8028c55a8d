package enginelog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"heft/agent/enginelog"
	"heft/shared/testutil"
)

// BenchmarkTrackerFeed feeds the sample logs line by line, as a follower
// does, and reports lines per second.
func BenchmarkTrackerFeed(b *testing.B) {
	var lines []string
	for _, name := range []string{"engines/vllm-dp2.log", "engines/sglang-dp2-even.log", "logs/vllm-color-workers.log"} {
		data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(b), "testdata", name))
		if err != nil {
			b.Fatal(err)
		}
		lines = append(lines, strings.Split(string(data), "\n")...)
	}
	kinds := []string{"vllm", "sglang"}
	b.ReportAllocs()
	for b.Loop() {
		for _, kind := range kinds {
			tr := enginelog.NewTracker(gram(b, kind))
			for _, l := range lines {
				tr.Feed(l)
			}
		}
	}
	b.ReportMetric(float64(len(lines)*len(kinds))*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}
