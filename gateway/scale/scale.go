// Package scale turns heft's float weights into the integer weights a
// gateway takes, keeping their ratios as closely as the gateway's range
// allows.
package scale

import "math"

// Ints maps positive weights onto integers in [1, hi] and returns them with
// the largest relative error of any weight's share of the total (0 when the
// ratios are kept exactly). Of the scales whose largest weight becomes 1…hi
// it picks the one with the smallest error, and the smallest numbers among
// equals. No weight becomes 0: a worker heft admits always gets traffic.
// Weights that are not positive numbers are treated as the smallest
// positive one; callers drain such workers before they get here.
func Ints(ws []float64, hi int) ([]int, float64) {
	if len(ws) == 0 {
		return nil, 0
	}
	hi = max(hi, 1)
	top := 0.0
	for _, w := range ws {
		if ok(w) {
			top = max(top, w)
		}
	}
	if top == 0 {
		out := make([]int, len(ws))
		for i := range out {
			out[i] = 1
		}
		return out, 0
	}
	var best []int
	bestErr := math.Inf(1)
	cur := make([]int, len(ws))
	for largest := 1; largest <= hi; largest++ {
		for i, w := range ws {
			if !ok(w) {
				cur[i] = 1
				continue
			}
			// w/top first: w·largest could overflow.
			cur[i] = min(hi, max(1, int(math.Round(w/top*float64(largest)))))
		}
		if e := ShareError(ws, cur); best == nil || e < bestErr-1e-12 {
			bestErr = e
			best = append(best[:0], cur...)
		}
	}
	return best, bestErr
}

// ShareError is the largest relative error of any share: max over i of
// |(n_i/Σn) / (w_i/Σw) − 1|. A worker whose share is 3 % too large or too
// small has an error of 0.03.
func ShareError[N int | float64](ws []float64, ns []N) float64 {
	// Shares of the weights over the largest: a sum of huge weights could
	// overflow to +Inf and make every error +Inf.
	top := 0.0
	for _, w := range ws {
		if ok(w) {
			top = max(top, w)
		}
	}
	var sw float64
	var sn N
	for i, w := range ws {
		if ok(w) {
			sw += w / top
			sn += ns[i]
		}
	}
	if sw == 0 || sn == 0 {
		return 0
	}
	worst := 0.0
	for i, w := range ws {
		if !ok(w) {
			continue
		}
		e := math.Abs((float64(ns[i])/float64(sn))/(w/top/sw) - 1)
		worst = max(worst, e)
	}
	return worst
}

func ok(w float64) bool { return w > 0 && !math.IsInf(w, 0) && !math.IsNaN(w) }
