package logwrap_test

import (
	"strings"
	"testing"

	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
)

// BenchmarkUnwrap unwraps the sample logs in each wrapper and reports
// lines per second, to compare with reading them raw ("none").
func BenchmarkUnwrap(b *testing.B) {
	var lines []string
	for _, name := range []string{"engines/vllm-dp2.log", "engines/sglang-dp2-even.log", "logs/vllm-color-workers.log"} {
		lines = append(lines, strings.Split(strings.TrimSuffix(string(testutil.ReadTestdata(b, name)), "\n"), "\n")...)
	}
	for _, tc := range []struct{ name, text string }{
		{"none", strings.Join(lines, "\n")},
		{"cri", wraptest.CRI(lines, t0, 16<<10)},
		{"docker-json", wraptest.DockerJSON(lines, t0, 16<<10)},
		{"journald-short", wraptest.Journal(lines, wraptest.Short, t0, "gpu-a", "python3", 7)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			in := strings.Split(strings.TrimSuffix(tc.text, "\n"), "\n")
			b.ReportAllocs()
			for b.Loop() {
				u := logwrap.New(func(string) {}, logwrap.Options{})
				for _, l := range in {
					u.Line(l)
				}
				u.Flush()
			}
			b.ReportMetric(float64(len(in))*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
		})
	}
}
