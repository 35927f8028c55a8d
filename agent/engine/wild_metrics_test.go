package engine

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// wildMetricsTruth is one entry of testdata/metrics/wild/truth.json: what a
// careful reader takes from a /metrics page pasted in a public issue.
type wildMetricsTruth struct {
	File    string `json:"file"`
	Kind    string `json:"kind"`
	Source  string `json:"source"`
	Version string `json:"version"`
	Expect  struct {
		ParseError bool    `json:"parse_error"`
		LoadKnown  bool    `json:"load_known"`
		Running    int     `json:"running"`
		Waiting    int     `json:"waiting"`
		KVUsage    float64 `json:"kv_usage"`
		Ranks      []struct {
			DPRank  int     `json:"dp_rank"`
			Running int     `json:"running"`
			Waiting int     `json:"waiting"`
			KVUsage float64 `json:"kv_usage"`
		} `json:"ranks"`
		Pools []struct {
			DPRank   int   `json:"dp_rank"`
			KVTokens int64 `json:"kv_tokens"`
		} `json:"pools"`
		Models    []string `json:"models"`
		Generated *struct {
			Value float64 `json:"value"`
			Live  bool    `json:"live"`
		} `json:"generated"` // null: the page holds no generated-tokens counter
		Prompt *struct {
			Total    float64 `json:"total"`
			Cached   float64 `json:"cached"`
			Computed float64 `json:"computed"`
		} `json:"prompt"` // null: the page holds no prompt-tokens counter
	} `json:"expect"`
}

// TestWildMetrics reads each real /metrics page in testdata/metrics/wild
// through ParseMetrics and checks what truth.json says a reader takes from it.
func TestWildMetrics(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "metrics", "wild")
	raw, err := os.ReadFile(filepath.Join(dir, "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var truths []wildMetricsTruth
	if err := json.Unmarshal(raw, &truths); err != nil {
		t.Fatalf("truth.json: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	if len(files) != len(truths) {
		t.Errorf("%d pages but %d truth entries", len(files), len(truths))
	}
	for _, tr := range truths {
		t.Run(tr.File, func(t *testing.T) {
			f, err := os.Open(filepath.Join(dir, tr.File))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ParseMetrics(tr.Kind, f)
			want := tr.Expect
			if want.ParseError {
				if err == nil {
					t.Fatalf("parsed; truth says the page does not parse (%s)", tr.Source)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse error %v (%s)", err, tr.Source)
			}
			l := got.Load
			if l.Known != want.LoadKnown || l.Running != want.Running || l.Waiting != want.Waiting || !closeTo(l.KVUsage, want.KVUsage) {
				t.Errorf("load known=%v running=%d waiting=%d kv=%g, want known=%v running=%d waiting=%d kv=%g",
					l.Known, l.Running, l.Waiting, l.KVUsage, want.LoadKnown, want.Running, want.Waiting, want.KVUsage)
			}
			if len(l.Ranks) != len(want.Ranks) {
				t.Errorf("ranks %+v, want %+v", l.Ranks, want.Ranks)
			} else {
				for i, r := range want.Ranks {
					g := l.Ranks[i]
					if g.DPRank != r.DPRank || g.Running != r.Running || g.Waiting != r.Waiting || !closeTo(g.KVUsage, r.KVUsage) {
						t.Errorf("rank %d: %+v, want %+v", i, g, r)
					}
				}
			}
			if len(got.Ranks) != len(want.Pools) {
				t.Errorf("pools %+v, want %+v", got.Ranks, want.Pools)
			} else {
				for i, p := range want.Pools {
					if got.Ranks[i].DPRank != p.DPRank || got.Ranks[i].KVTokens != p.KVTokens {
						t.Errorf("pool %d: %+v, want %+v", i, got.Ranks[i], p)
					}
				}
			}
			if !slices.Equal(got.Models, want.Models) && len(got.Models)+len(want.Models) > 0 {
				t.Errorf("models %q, want %q", got.Models, want.Models)
			}
			switch g := want.Generated; {
			case g == nil && got.GeneratedKnown:
				t.Errorf("generated %g known; the page has no generated counter", got.Generated)
			case g != nil && (!got.GeneratedKnown || !closeTo(got.Generated, g.Value) || got.GeneratedLive != g.Live):
				t.Errorf("generated %g known=%v live=%v, want %g live=%v",
					got.Generated, got.GeneratedKnown, got.GeneratedLive, g.Value, g.Live)
			}
			switch p := want.Prompt; {
			case p == nil && got.PromptKnown:
				t.Errorf("prompt %g known; the page has no prompt counter", got.PromptComputed)
			case p != nil && (!got.PromptKnown || !closeTo(got.PromptComputed, p.Computed)):
				t.Errorf("prompt computed %g known=%v, want %g (total %g less cached %g)",
					got.PromptComputed, got.PromptKnown, p.Computed, p.Total, p.Cached)
			}
		})
	}
}

func closeTo(a, b float64) bool {
	return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b))
}
