package scale

import (
	"math"
	"slices"
	"testing"
)

func TestInts(t *testing.T) {
	cases := []struct {
		name    string
		ws      []float64
		hi      int
		want    []int
		maxErr  float64
		exactly bool
	}{
		// PRODUCT.md's first result: 992 vs 453 tok/s, weights 1.37 and 0.63.
		{name: "two workers 1.37/0.63 in haproxy's range", ws: []float64{1.37, 0.63}, hi: 256, want: []int{137, 63}, exactly: true},
		{name: "three workers 2.22/1.00/0.32", ws: []float64{2.22, 1.00, 0.32}, hi: 256, want: []int{111, 50, 16}, exactly: true},
		{name: "2.22/1.00/0.32 in nginx's 1..100", ws: []float64{2.22, 1.00, 0.32}, hi: 100, maxErr: 0.02},
		{name: "the issue's 71/32/11 fleet", ws: []float64{2.2188, 1.0, 0.3438}, hi: 256, maxErr: 0.005},
		{name: "the clamp's extremes 8 and 0.25", ws: []float64{8, 0.25}, hi: 256, want: []int{32, 1}, exactly: true},
		{name: "a single worker", ws: []float64{1.7}, hi: 256, want: []int{1}, exactly: true},
		{name: "equal weights", ws: []float64{1, 1, 1}, hi: 256, want: []int{1, 1, 1}, exactly: true},
		{name: "a ratio the range cannot hold keeps every worker at 1 or more", ws: []float64{1000, 1}, hi: 256, want: []int{256, 1}, maxErr: 3},
		{name: "a weight of 0 becomes 1", ws: []float64{1, 0}, hi: 100, want: []int{1, 1}},
		{name: "nothing", ws: nil, hi: 256, want: nil, exactly: true},
		// Their sum overflows a float64: every share error was +Inf, no
		// scale was chosen and the callers indexed an empty result.
		{name: "weights whose sum overflows", ws: []float64{1e308, 1e308}, hi: 256, want: []int{1, 1}, exactly: true},
		{name: "huge weights keep their ratio", ws: []float64{1e308, 5e307, 2.5e307}, hi: 256, want: []int{4, 2, 1}, exactly: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, e := Ints(c.ws, c.hi)
			if len(got) != len(c.ws) {
				t.Fatalf("Ints(%v, %d) = %v: %d weights for %d", c.ws, c.hi, got, len(got), len(c.ws))
			}
			if c.want != nil && !slices.Equal(got, c.want) {
				t.Fatalf("Ints(%v, %d) = %v, want %v", c.ws, c.hi, got, c.want)
			}
			for i, n := range got {
				if n < 1 || n > c.hi {
					t.Fatalf("weight %d = %d is outside 1..%d", i, n, c.hi)
				}
			}
			if c.exactly && e > 1e-9 {
				t.Fatalf("error %g, want exact ratios", e)
			}
			if c.maxErr > 0 && e > c.maxErr {
				t.Fatalf("error %g over %g (got %v)", e, c.maxErr, got)
			}
			if len(got) > 0 && math.Abs(e-ShareError(c.ws, got)) > 1e-12 {
				t.Fatalf("reported error %g is not the share error %g", e, ShareError(c.ws, got))
			}
		})
	}
}

// The chosen scale is the best of the range: no other largest value gives
// a smaller error.
func TestIntsIsBestInRange(t *testing.T) {
	ws := []float64{2.37, 1.13, 0.41, 0.29}
	for _, hi := range []int{10, 50, 100, 256} {
		got, e := Ints(ws, hi)
		for top := 1; top <= hi; top++ {
			s := float64(top) / 2.37
			ns := make([]int, len(ws))
			for i, w := range ws {
				ns[i] = max(1, int(math.Round(w*s)))
			}
			if ShareError(ws, ns) < e-1e-12 {
				t.Fatalf("hi %d: %v (error %g) beaten by %v (error %g)", hi, got, e, ns, ShareError(ws, ns))
			}
		}
	}
}

func TestShareError(t *testing.T) {
	// 2:1 written as 3:1: shares 0.75/0.25 instead of 0.667/0.333.
	e := ShareError([]float64{2, 1}, []int{3, 1})
	if math.Abs(e-0.25) > 1e-12 {
		t.Fatalf("ShareError = %g, want 0.25 (the small worker gets 25 %% less than its share)", e)
	}
}
