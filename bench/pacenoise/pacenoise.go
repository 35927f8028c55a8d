// Package pacenoise measures how noisy a windowed pace reading is on real
// engines, from stats lines people pasted in public issues
// (testdata/pace-wild).
//
// heft's agent reports, every W/2, a pace reading: the mean seconds per
// generated token of one request over the last W seconds, with the mean
// running count. The coordinator (coordinator/fleet/pace.go) compares each
// reading with its reference at the same batch and rescales the worker's
// capacity when PaceReadings (2) readings in a row are more than
// PaceTolerance (15 %) slower. That rule is only as good as the readings are
// quiet: if a healthy engine's pace wanders by more than 15 % from one
// window to the next, two slow readings in a row happen by chance and heft
// rescales a worker that did not slow down.
//
// From vLLM's periodic stats lines (Avg prompt / generation throughput,
// Running) and SGLang's "Decode batch" lines (#running-req, gen
// throughput), this package builds the intervals between lines, keeps the
// steady stretches (running ≥ 2, generating, running within ±20 % of the
// stretch median), builds windows of W ∈ {5, 10, 15, 20, 30} s from
// consecutive intervals, a new one every W/2, and compares each window's
// pace with the median pace of the same-W windows in the same stretch at
// the same running (±20 %; groups of ≥ 3 windows). Per W it counts how far
// the readings stray (p95, max of |ratio − 1|), how many read > 15 %
// slower, and how many consecutive pairs both did: what would have
// triggered a false rescale.
//
// Windows are split by class: "with prefill" (a vLLM window with an
// interval whose prompt throughput is > 0) and "decode only" (SGLang decode
// lines, vLLM windows without prompt throughput). Prompts read in a window
// stretch its decode steps; that is the noise the coordinator takes out of
// a pace reading by the prompts' share of the engine's time
// (coordinator/fleet/pace.go).
package pacenoise

import (
	"math"
	"slices"
)

// Parameters of the analysis.
const (
	Slow       = 1.15 // a reading more than 15 % slower than its reference (fleet.PaceTolerance)
	Strong     = 1.30 // one reading more than 30 % slower: a tentative rescale on its own (fleet.PaceStrong)
	RunTol     = 0.20 // "same running": within ±20 %
	MinGroup   = 3    // windows a comparison group needs
	MinStretch = 3    // intervals a steady stretch needs
	SGLangK    = 40   // SGLang's default --decode-log-interval, in decode steps
)

// Widths are the window lengths W, in seconds.
var Widths = []float64{5, 10, 15, 20, 30}

// Class sorts windows by whether prompts were read in them.
type Class int

// Classes.
const (
	All Class = iota
	WithPrefill
	DecodeOnly
)

func (c Class) String() string {
	return [...]string{"all", "with prefill", "decode only"}[c]
}

// Window is one pace reading.
type Window struct {
	File     string
	W        float64 // asked length, s
	Stretch  int     // index of its steady stretch in the source
	Start, N int     // first interval in the stretch, and how many
	Len      float64 // seconds it covers
	Running  float64 // time-weighted mean running
	SPT      float64 // seconds per generated token of one request
	Prefill  bool    // a vLLM interval in it read prompts
	// Ratio is SPT over the median SPT of its comparison group; 0 when the
	// group has fewer than MinGroup windows.
	Ratio float64
	// NextRatio is Ratio of the next window in the same stretch (W/2 later);
	// 0 when there is none or it has no comparison.
	NextRatio float64
}

// Class is w's class (WithPrefill or DecodeOnly).
func (w *Window) Class() Class {
	if w.Prefill {
		return WithPrefill
	}
	return DecodeOnly
}

// Stretches are the steady stretches of s: at least MinStretch consecutive
// intervals with running ≥ 2 and tokens generated, each running count
// within ±RunTol of the stretch's median.
func (s *Source) Stretches() [][]Interval {
	var res [][]Interval
	for _, seg := range s.Segments {
		var cur []Interval
		for _, iv := range seg {
			if iv.Running < 2 || iv.GenTPS <= 0 || iv.DT <= 0 {
				if len(cur) > 0 {
					res = append(res, cur)
				}
				cur = nil
				continue
			}
			trial := append(slices.Clip(cur), iv)
			rs := make([]float64, len(trial))
			for i, x := range trial {
				rs[i] = float64(x.Running)
			}
			med := median(rs)
			steady := true
			for _, r := range rs {
				steady = steady && math.Abs(r-med) <= RunTol*med
			}
			if steady {
				cur = trial
				continue
			}
			if len(cur) > 0 {
				res = append(res, cur)
			}
			cur = []Interval{iv}
		}
		if len(cur) > 0 {
			res = append(res, cur)
		}
	}
	return slices.DeleteFunc(res, func(st []Interval) bool { return len(st) < MinStretch })
}

// pace is the window reading over ivs: mean running (time-weighted) times
// the time over the tokens generated; also the mean running and the time.
func pace(ivs []Interval) (spt, running, length float64) {
	var tok, rdt float64
	for _, x := range ivs {
		length += x.DT
		tok += x.GenTPS * x.DT
		rdt += float64(x.Running) * x.DT
	}
	running = rdt / length
	return running * length / tok, running, length
}

// windows of about w seconds over a stretch: n consecutive intervals
// (w over the median interval, rounded), a new window every n/2 intervals
// (rounded half up: every W/2, as heft reads). None when the log interval
// is coarser than the window.
func windows(st []Interval, w float64) []Window {
	dts := make([]float64, len(st))
	for i, x := range st {
		dts[i] = x.DT
	}
	dmed := median(dts)
	if w < 0.75*dmed {
		return nil
	}
	n := max(1, int(w/dmed+0.55))
	step := max(1, int(float64(n)/2+0.5))
	var out []Window
	for j := 0; j+n <= len(st); j += step {
		ivs := st[j : j+n]
		spt, running, length := pace(ivs)
		win := Window{W: w, Start: j, N: n, Len: length, Running: running, SPT: spt}
		for _, x := range ivs {
			win.Prefill = win.Prefill || x.PromptTPS > 0
		}
		out = append(out, win)
	}
	return out
}

// Windows are s's windows of width w, stretch by stretch, each compared
// with the median of the same stretch's windows at the same running.
func (s *Source) Windows(w float64) []Window {
	var all []Window
	for si, st := range s.Stretches() {
		wins := windows(st, w)
		for i := range wins {
			wins[i].File, wins[i].Stretch = s.File, si
			var grp []float64
			for _, v := range wins {
				if math.Abs(v.Running-wins[i].Running) <= RunTol*wins[i].Running {
					grp = append(grp, v.SPT)
				}
			}
			if len(grp) >= MinGroup {
				wins[i].Ratio = wins[i].SPT / median(grp)
			}
		}
		for i := 0; i+1 < len(wins); i++ {
			wins[i].NextRatio = wins[i+1].Ratio
		}
		all = append(all, wins...)
	}
	return all
}

// Summary is what the windows of one W and class say.
type Summary struct {
	W        float64
	Class    Class
	Formed   int     // windows built
	Compared int     // windows with a comparison group
	P95, Max float64 // of |ratio − 1| over the compared windows (nearest rank); NaN when none
	Slower   int     // compared windows more than 15 % slower
	Stronger int     // of those, more than 30 % slower
	// Pairs are consecutive compared windows of a stretch (the second
	// starting W/2 after the first), counted in the first one's class;
	// SlowPairs those where both read more than 15 % slower: heft's
	// rescale condition.
	Pairs, SlowPairs int
}

// Summarise sums up the windows of class c (All: every window).
func Summarise(wins []Window, w float64, c Class) Summary {
	s := Summary{W: w, Class: c, P95: math.NaN(), Max: math.NaN()}
	var dev []float64
	for _, x := range wins {
		if c != All && x.Class() != c {
			continue
		}
		s.Formed++
		if x.Ratio == 0 {
			continue
		}
		s.Compared++
		dev = append(dev, math.Abs(x.Ratio-1))
		if x.Ratio > Slow {
			s.Slower++
		}
		if x.Ratio > Strong {
			s.Stronger++
		}
		if x.NextRatio != 0 {
			s.Pairs++
			if x.Ratio > Slow && x.NextRatio > Slow {
				s.SlowPairs++
			}
		}
	}
	if len(dev) > 0 {
		slices.Sort(dev)
		s.P95 = percentile(dev, 95)
		s.Max = dev[len(dev)-1]
	}
	return s
}

// Analyse summarises the sources' windows per W and class (All,
// WithPrefill, DecodeOnly).
func Analyse(srcs []*Source) []Summary {
	var out []Summary
	for _, w := range Widths {
		var wins []Window
		for _, s := range srcs {
			wins = append(wins, s.Windows(w)...)
		}
		for _, c := range []Class{All, WithPrefill, DecodeOnly} {
			out = append(out, Summarise(wins, w, c))
		}
	}
	return out
}

// median of xs (the mean of the middle two for an even count); xs is not
// changed.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile is the nearest-rank p-th percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	k := max(0, int(math.Ceil(p/100*float64(len(sorted))))-1)
	return sorted[k]
}
