package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Summary is the median of several values with their range.
type Summary struct {
	N                int
	Median, Min, Max float64
	Values           []float64 // sorted
}

// Summarize returns the median, min and max of xs; an empty xs gives NaNs.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Summary{N: n, Median: med, Min: s[0], Max: s[n-1], Values: s}
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of xs.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Known reports whether the summary holds any value.
func (s Summary) Known() bool { return s.N > 0 && !math.IsNaN(s.Median) }

// Format writes "median (min–max)" with prec decimals, or just the median
// for a single value, or "n/a" for none.
func (s Summary) Format(prec int) string {
	if !s.Known() {
		return "n/a"
	}
	if s.N == 1 || s.Min == s.Max {
		return num(s.Median, prec)
	}
	return fmt.Sprintf("%s (%s–%s)", num(s.Median, prec), num(s.Min, prec), num(s.Max, prec))
}

// FormatPct writes a ratio r as a signed percentage error (r−1), e.g.
// "−0.4 % (−0.9–+0.2)".
func (s Summary) FormatPct(prec int) string {
	if !s.Known() {
		return "n/a"
	}
	if s.N == 1 || s.Min == s.Max {
		return pct(s.Median-1, prec)
	}
	return fmt.Sprintf("%s (%s–%s)", pct(s.Median-1, prec), signed(100*(s.Min-1), prec), signed(100*(s.Max-1), prec))
}

// num formats x with prec decimals and thousands separators.
func num(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	s := strconv.FormatFloat(math.Abs(x), 'f', prec, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if x < 0 && strings.Trim(s, "0.") != "" {
		b.WriteString("−")
	}
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if frac != "" {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}

// signed formats x with a sign, e.g. "+1.2" or "−0.4".
func signed(x float64, prec int) string {
	s := num(x, prec)
	if !strings.HasPrefix(s, "−") && s != "n/a" {
		s = "+" + s
	}
	return s
}

// pct formats a fraction as a signed percentage, e.g. "+1.2 %".
func pct(frac float64, prec int) string { return signed(100*frac, prec) + " %" }

// Verdicts.
const (
	Pass = "pass"
	Info = "—"
)

// within judges a ratio against a symmetric tolerance around 1: the
// median decides; runs outside the band are counted.
func within(s Summary, tol float64) string {
	if !s.Known() {
		return "miss: not measured"
	}
	v := Pass
	if d := math.Abs(s.Median - 1); d > tol {
		v = fmt.Sprintf("miss by %s pp", num(100*(d-tol), 1))
	}
	return v + outside(s, func(x float64) bool { return math.Abs(x-1) > tol })
}

// atMost judges a value against an upper bound.
func atMost(s Summary, limit float64, prec int, unit string) string {
	if !s.Known() {
		return "miss: not measured"
	}
	v := Pass
	if s.Median > limit {
		v = fmt.Sprintf("miss: %s%s over", num(s.Median-limit, prec), unit)
	}
	return v + outside(s, func(x float64) bool { return x > limit })
}

// outside notes how many of several values break the target.
func outside(s Summary, bad func(float64) bool) string {
	if s.N < 2 {
		return ""
	}
	n := 0
	for _, x := range s.Values {
		if bad(x) {
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d of %d runs outside)", n, s.N)
}
