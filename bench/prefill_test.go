package bench

import (
	"cmp"
	"math"
	"slices"
	"testing"
)

func TestPrefillCalibrationsDisagree(t *testing.T) {
	const decodePrompt = 18 // the probe's default prompt: 11 words, "lighthouse" being two, + the template's 6
	type row struct {
		name            string
		decode, prefill float64
	}
	want := map[string][2]float64{ // the table in PrefillCalibrations' comment
		"h20-like": {1492.2, 4477.6}, "a100-like": {1246.5, 6937.6}, "l40s-like": {849.6, 12711.8},
		"4090-dp2": {722.4, 17647.5}, "mac-studio": {319.7, 2483.2},
	}
	var rows []row
	for _, c := range PrefillCalibrations {
		d, err := c.TrueDecodeCapacity(16, decodePrompt, 128)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.TruePrefillCapacity(4, 8192)
		if err != nil {
			t.Fatal(err)
		}
		if w := want[c.Name]; math.Abs(d-w[0]) > 0.05 || math.Abs(p-w[1]) > 0.05 {
			t.Errorf("%s (%v): decode %.1f, prefill %.1f; the table says %v", c.Name, c, d, p, w)
		}
		// By hand: prompts of 8,192 ≥ the step budget read at
		// 1/(1/P + 1/(L·S1)) per rank, on ⌈4/D⌉ prompts of the fullest rank.
		perRank := math.Ceil(4 / float64(c.ranks()))
		if byHand := 4 * 8192 / (perRank * (8192/c.PrefillTPS + 1/c.SingleTPS)); math.Abs(p-byHand) > 1e-6*byHand {
			t.Errorf("%s: prefill %.3f, by hand %.3f", c.Name, p, byHand)
		}
		// The decode burst's prompts cost little: within 1 % of the decode-only model.
		if plain := c.TrueCapacity(16); d > plain || d < 0.99*plain {
			t.Errorf("%s: decode %.1f, decode-only model %.1f", c.Name, d, plain)
		}
		rows = append(rows, row{c.Name, d, p})
	}
	order := func(key func(row) float64) []string {
		s := slices.Clone(rows)
		slices.SortFunc(s, func(a, b row) int { return cmp.Compare(key(b), key(a)) })
		names := make([]string, len(s))
		for i, r := range s {
			names[i] = r.name
		}
		return names
	}
	byDecode := order(func(r row) float64 { return r.decode })
	byPrefill := order(func(r row) float64 { return r.prefill })
	if !slices.Equal(byDecode, []string{"h20-like", "a100-like", "l40s-like", "4090-dp2", "mac-studio"}) ||
		!slices.Equal(byPrefill, []string{"4090-dp2", "l40s-like", "a100-like", "h20-like", "mac-studio"}) {
		t.Errorf("decode order %v, prefill order %v", byDecode, byPrefill)
	}
	// Neighbours in each ranking are at least 10 % apart, so a ±3 %
	// measurement cannot swap them.
	for _, key := range []func(row) float64{func(r row) float64 { return r.decode }, func(r row) float64 { return r.prefill }} {
		s := slices.Clone(rows)
		slices.SortFunc(s, func(a, b row) int { return cmp.Compare(key(b), key(a)) })
		for i := 1; i < len(s); i++ {
			if key(s[i-1]) < 1.1*key(s[i]) {
				t.Errorf("%s and %s are within 10 %%: %.1f, %.1f", s[i-1].name, s[i].name, key(s[i-1]), key(s[i]))
			}
		}
	}
}
