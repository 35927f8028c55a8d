package agent

import (
	"math"
	"slices"
	"strings"
	"testing"

	"heft/shared/wire"
)

// A bad figure in a reading the agent computes costs that reading, not
// the snapshot: the rest still passes the wire's checks and is sent.
func TestDropInvalidReadings(t *testing.T) {
	pace := func() *wire.Pace {
		return &wire.Pace{WindowSeconds: 10, SecondsPerToken: 0.008, Batch: 12, ThroughputTPS: 1500,
			Recent: &wire.PaceSpan{WindowSeconds: 5, SecondsPerToken: 0.009, Batch: 12}}
	}
	passive := func() *wire.Passive { return &wire.Passive{WindowSeconds: 30, ThroughputTPS: 1700, Concurrency: 16} }
	for _, c := range []struct {
		name  string
		bend  func(e *wire.Engine)
		want  []string // readings left: "pace", "recent", "passive"
		drops int
		valid bool
	}{
		{"all good", func(e *wire.Engine) {}, []string{"pace", "recent", "passive"}, 0, true},
		{"negative prompt rate in the newest half", func(e *wire.Engine) { e.Pace.Recent.PromptTPS = -200 }, []string{"pace", "passive"}, 1, true},
		{"NaN pace", func(e *wire.Engine) { e.Pace.SecondsPerToken = math.NaN() }, []string{"passive"}, 1, true},
		{"negative passive", func(e *wire.Engine) { e.Passive.ThroughputTPS = -1 }, []string{"pace", "recent"}, 1, true},
		{"bad pace and bad passive", func(e *wire.Engine) { e.Pace.Batch = math.Inf(1); e.Passive.Concurrency = -3 }, nil, 2, true},
		{"not a reading: left for the link to refuse", func(e *wire.Engine) { e.URL = "" }, []string{"pace", "recent", "passive"}, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := wire.Engine{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", Pace: pace(), Passive: passive()}
			c.bend(&e)
			s := wire.Snapshot{Node: "gpu-a", Engines: []wire.Engine{e}}
			dropped := dropInvalidReadings(&s)
			var left []string
			got := s.Engines[0]
			if got.Pace != nil {
				left = append(left, "pace")
				if got.Pace.Recent != nil {
					left = append(left, "recent")
				}
			}
			if got.Passive != nil {
				left = append(left, "passive")
			}
			if !slices.Equal(left, c.want) || len(dropped) != c.drops {
				t.Fatalf("left %v, dropped %q; want %v and %d dropped", left, dropped, c.want, c.drops)
			}
			for _, d := range dropped {
				if !strings.HasPrefix(d, "http://127.0.0.1:8000: ") || !strings.Contains(d, "engine.pa") {
					t.Errorf("dropped %q does not name the engine and the field", d)
				}
			}
			if err := s.Validate(); (err == nil) != c.valid {
				t.Fatalf("snapshot validates: %v, want valid %v", err, c.valid)
			}
		})
	}
}
