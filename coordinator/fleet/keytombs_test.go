package fleet

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The tombs' age order names the oldest tomb a scan of them all would,
// the least key among equal times, through burials (some at past times,
// as a restart buries), claims, a node's release and sweeps, and the
// bound on their number evicts in that order.
func TestTombAgeOrderMatchesAScan(t *testing.T) {
	cfg := testConfig()
	cfg.MaxKeyTombs, cfg.MaxKeysPerNode = 300, 40
	clk := &clock{t: t0}
	f, err := New(cfg, newMemStore(), clk.now, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range 5000 {
		key, node := fmt.Sprintf("k%03d", rng.IntN(600)), fmt.Sprintf("n%02d", rng.IntN(20))
		switch op := rng.IntN(20); {
		case op < 12:
			f.bury(key, node, clk.now().Add(-time.Duration(rng.IntN(4))*time.Hour))
		case op < 16:
			f.unbury(key)
		case op < 17:
			f.unburyNode(node)
		default:
			clk.advance(time.Duration(rng.IntN(6)) * 24 * time.Hour)
			f.sweepTombs(clk.now())
			for k, tb := range f.keyTombs {
				if clk.now().Sub(tb.Forgotten) >= cfg.KeyTombTTL {
					t.Fatalf("step %d: tomb %s past its TTL after a sweep", i, k)
				}
			}
		}
		checkTombAge(t, f, i)
		if t.Failed() {
			return
		}
	}
}

// checkTombAge compares tombAge with the tombs it orders.
func checkTombAge(t *testing.T, f *Fleet, step int) {
	t.Helper()
	if len(f.tombAge.items) != len(f.keyTombs) || len(f.tombAge.at) != len(f.keyTombs) {
		t.Fatalf("step %d: %d tombs, %d ordered, %d indexed", step, len(f.keyTombs), len(f.tombAge.items), len(f.tombAge.at))
	}
	if len(f.keyTombs) > f.cfg.MaxKeyTombs {
		t.Fatalf("step %d: %d tombs, bound %d", step, len(f.keyTombs), f.cfg.MaxKeyTombs)
	}
	victim, oldest := "", time.Time{}
	for k, tb := range f.keyTombs {
		if victim == "" || tb.Forgotten.Before(oldest) || tb.Forgotten.Equal(oldest) && k < victim {
			victim, oldest = k, tb.Forgotten
		}
	}
	if got, ok := f.tombAge.oldest(); ok != (victim != "") || got.key != victim || !got.forgotten.Equal(oldest) {
		t.Fatalf("step %d: oldest by age order %+v, by a scan %s at %s", step, got, victim, oldest)
	}
}
