package sim

import (
	"fmt"
	"math"
	"time"
)

// Slow is a throttle that sets in mid-run, as a GPU whose clocks drop or
// an engine that another tenant starts to share: from At after start, every
// step takes Factor times as long, with no restart and the same launch
// arguments. Factor 1 (or 0, read as 1) is no throttle.
type Slow struct {
	At     time.Duration
	Factor float64
}

func (s *Slow) normalize() error {
	if s.Factor == 0 {
		s.Factor = 1
	}
	switch {
	case math.IsNaN(s.Factor) || math.IsInf(s.Factor, 0) || s.Factor < 1:
		return fmt.Errorf("slow-factor must be a number ≥ 1, got %v", s.Factor)
	case s.At < 0:
		return fmt.Errorf("slow-at must not be negative, got %s", s.At)
	}
	return nil
}

// factor is the throttle on a step that starts since after start.
func (s Slow) factor(since time.Duration) float64 {
	if s.Factor > 1 && since >= s.At {
		return s.Factor
	}
	return 1
}
