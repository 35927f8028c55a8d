package pacenoise

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// WriteMarkdown prints the summaries as a markdown table, then one line
// per source.
func WriteMarkdown(out io.Writer, srcs []*Source, sums []Summary) error {
	var b strings.Builder
	b.WriteString("Pace readings vs the median of same-W windows in the same stretch at the same running (±20 %, groups of ≥ 3).\n")
	b.WriteString("windows: compared windows; p95, max: of |ratio − 1|; slow pairs: consecutive readings (W/2 apart) both > 15 % slower; > 30 % slower: readings that rescale tentatively on their own.\n\n")
	b.WriteString("| W (s) | class | windows | p95 | max | >15 % slower | >30 % slower | slow pairs / pairs |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "| %g | %s | %d | %s | %s | %d | %d | %d / %d |\n",
			s.W, s.Class, s.Compared, pct(s.P95), pct(s.Max), s.Slower, s.Stronger, s.SlowPairs, s.Pairs)
	}
	b.WriteString("\nSources:\n\n")
	for _, s := range srcs {
		kept := 0
		var sizes []string
		for _, st := range s.Stretches() {
			kept += len(st)
			sizes = append(sizes, fmt.Sprint(len(st)))
		}
		fmt.Fprintf(&b, "- %s: %s, %d intervals, %d kept in steady stretches (%s)\n",
			s.File, s.EngineName(), s.Intervals(), kept, strings.Join(sizes, ", "))
	}
	_, err := io.WriteString(out, b.String())
	return err
}

func pct(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", 100*x)
}
