package engine

import (
	"bytes"
	"maps"
	"testing"

	"heft/shared/testutil"
)

// The generated-tokens counter is read from the engines' own pages, per
// rank where the engine labels it.
func TestParseMetricsGenerated(t *testing.T) {
	tests := []struct {
		kind, file string
		known      bool
		total      float64
		ranks      map[int]float64
	}{
		{"vllm", "engines/vllm-dp2-metrics.txt", true, 10528 + 9308, map[int]float64{0: 10528, 1: 9308}},
		{"sglang", "engines/sglang-dp2-uneven-metrics.txt", true, 4117, map[int]float64{0: 4117}},
		{"llamacpp", "metrics/llamacpp.txt", true, 2048, map[int]float64{0: 2048}},
		{"vllm", "metrics/vllm-v0-old-names.txt", false, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			mf, err := ParseMetrics(tt.kind, bytes.NewReader(testutil.ReadTestdata(t, tt.file)))
			if err != nil {
				t.Fatal(err)
			}
			if mf.GeneratedKnown != tt.known || mf.Generated != tt.total || !maps.Equal(mf.GeneratedRanks, tt.ranks) {
				t.Errorf("generated = %v %v %v, want %v %v %v", mf.GeneratedKnown, mf.Generated, mf.GeneratedRanks, tt.known, tt.total, tt.ranks)
			}
		})
	}
}
