package sim

import (
	"strings"
	"testing"
	"time"
)

// --slow-at/--slow-factor: every step from the set time on takes factor
// times as long, on top of a cold start's factor; no throttle before.
func TestSlowThrottle(t *testing.T) {
	m := stepModel{t0: 0.004, k: 0.001, start: time.Now(), coldFactor: 3, coldFor: time.Second,
		slow: Slow{At: 10 * time.Second, Factor: 2}}
	for _, tc := range []struct {
		at   time.Duration
		want float64
	}{
		{500 * time.Millisecond, 3}, // cold, not yet slow
		{5 * time.Second, 1},        // warm, full speed
		{10 * time.Second, 2},       // the throttle sets in
		{time.Hour, 2},              // and stays
	} {
		if f := m.cold(m.start.Add(tc.at)); f != tc.want {
			t.Errorf("factor at %s = %v, want %v", tc.at, f, tc.want)
		}
	}
	// Slow from the start: an engine restarted at half speed.
	m.slow, m.coldFor = Slow{Factor: 2}, 0
	if f := m.cold(m.start); f != 2 {
		t.Errorf("slow from the start: factor %v, want 2", f)
	}

	for _, tc := range []struct {
		slow Slow
		want string
	}{
		{Slow{Factor: 0.5}, "slow-factor must be a number ≥ 1"},
		{Slow{At: -time.Second, Factor: 2}, "slow-at must not be negative"},
	} {
		_, err := Start(Config{SingleTPS: 60, Batch16TPS: 600, Slow: tc.slow}, "127.0.0.1:0")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", tc.slow, err, tc.want)
		}
	}
}
