package health

import (
	"fmt"
	"strconv"
	"strings"

	"heft/shared/wire"
)

// The pool rules. A set of pools is judged even or uneven only when it is
// whole: while a rank the launch arguments or the log's rank markers
// promise has no pool, the smallest pool is unknown, so no ratio is given
// and the set is never called even. An imbalance already visible among
// the ranks found is still reported, naming the rank, but as a warning:
// a partial set does not hold a worker (its other ranks may be on another
// node, where they are real).

// Whole reports whether e's pools are all of its ranks, as far as the
// agent knows; an agent that does not say (Complete nil) is believed, as
// before completeness was reported.
func Whole(e wire.Engine) bool { return e.Complete == nil || *e.Complete }

// PoolRatio returns smallest/largest pool and the ranks holding them.
// ok is false with fewer than two ranks or an empty largest pool. It
// knows nothing of missing ranks: see EnginePoolRatio.
func PoolRatio(ranks []wire.Rank) (ratio float64, smallest, largest wire.Rank, ok bool) {
	if len(ranks) < 2 {
		return 0, wire.Rank{}, wire.Rank{}, false
	}
	smallest, largest = ranks[0], ranks[0]
	for _, r := range ranks[1:] {
		if r.KVTokens < smallest.KVTokens {
			smallest = r
		}
		if r.KVTokens > largest.KVTokens {
			largest = r
		}
	}
	if largest.KVTokens <= 0 {
		return 0, smallest, largest, false
	}
	return float64(smallest.KVTokens) / float64(largest.KVTokens), smallest, largest, true
}

// EnginePoolRatio is smallest/largest over an engine's pools when the set
// is whole; ok is false for an incomplete set, whose smallest is unknown.
func EnginePoolRatio(e wire.Engine) (float64, bool) {
	if !Whole(e) {
		return 0, false
	}
	ratio, _, _, ok := PoolRatio(e.Ranks)
	return ratio, ok
}

// Pools warns when the data-parallel pools of a whole set are uneven. A
// critical finding means the worker must be held out of the weight table.
func Pools(ranks []wire.Rank, th Thresholds) *Finding {
	ratio, small, large, ok := PoolRatio(ranks)
	if !ok || ratio >= th.PoolWarn {
		return nil
	}
	sev := wire.SeverityWarning
	verdict := "It is admitted, but watch it."
	if ratio < th.PoolHold {
		sev = wire.SeverityCritical
		verdict = "It is held out of the weight table until the pools are even or an admin admits it."
	}
	return &Finding{Code: wire.CodeDPPoolImbalance, Severity: sev, Message: imbalanceMessage("", ratio, small, large, len(ranks), verdict)}
}

// partialPools warns of an imbalance among the ranks found of an
// incomplete set: a warning whatever the ratio, since the set is partial.
func partialPools(e wire.Engine, th Thresholds) *Finding {
	ratio, small, large, ok := PoolRatio(e.Ranks)
	if !ok || ratio >= th.PoolWarn {
		return nil
	}
	n := max(e.ExpectedRanks, len(e.Ranks))
	among := fmt.Sprintf(" among the %d of %d ranks that printed one", len(e.Ranks), n)
	verdict := "It is not held while the set is incomplete (the other ranks may be on another node), but the missing ranks can only make it more uneven."
	return &Finding{Code: wire.CodeDPPoolImbalance, Severity: wire.SeverityWarning, Message: imbalanceMessage(among, ratio, small, large, n, verdict)}
}

func imbalanceMessage(among string, ratio float64, small, large wire.Rank, ranks int, verdict string) string {
	return fmt.Sprintf(
		"data-parallel pools are uneven%s: rank %d holds %s KV tokens, rank %d only %s (%.0f%% of the largest). "+
			"Requests are dealt to ranks in turn, so every %s request lands on the small pool, where few fit and the rest queue while the other ranks sit idle. "+
			"%s Fix: give each rank whole, empty GPUs (find the foreign process on rank %d's GPU, it started with less free memory), "+
			"or run the ranks as separate servers behind heft's weights.",
		among, large.DPRank, Thousands(large.KVTokens), small.DPRank, Thousands(small.KVTokens), ratio*100,
		ordinal(ranks), verdict, small.DPRank)
}

// PoolsHold reports whether e's pools alone hold its worker: a whole set
// below Thresholds.PoolHold.
func PoolsHold(e wire.Engine, th Thresholds) bool {
	if !Whole(e) {
		return false
	}
	f := Pools(e.Ranks, th)
	return f != nil && f.Severity == wire.SeverityCritical
}

// PoolFindings are the warnings about an engine's pools: an imbalance
// (dp_pool_imbalance), ranks without a pool (pools_incomplete), no pool
// known where one matters (pools_unknown), and the log and the engine's
// endpoints disagreeing (pools_disagree).
func PoolFindings(e wire.Engine, th Thresholds) []Finding {
	var out []Finding
	if Whole(e) {
		if f := Pools(e.Ranks, th); f != nil {
			out = append(out, *f)
		}
	} else if len(e.Ranks) > 0 {
		if f := partialPools(e, th); f != nil {
			out = append(out, *f)
		}
		out = append(out, Incomplete(len(e.Ranks), e.ExpectedRanks, "", e.MissingRanks))
	}
	if f := PoolsUnknown(e); f != nil {
		out = append(out, *f)
	}
	if f := PoolsDisagree(e); f != nil {
		out = append(out, *f)
	}
	return out
}

// IncompleteMessage says which ranks of an incomplete set have no pool,
// and why that may be. from, when not "", says what promised expected
// ranks ("the launch args say data_parallel_size=4").
func IncompleteMessage(found, expected int, from string, missing []int) string {
	if from != "" {
		from = " (" + from + ")"
	}
	return fmt.Sprintf("expected %d data-parallel ranks%s but %d printed a KV pool; none from DP %s (still starting, failed before sizing its KV cache, or on another node)",
		expected, from, found, RankList(missing))
}

// Incomplete is the pools_incomplete warning: a warning, never a hold.
func Incomplete(found, expected int, from string, missing []int) Finding {
	return Finding{Code: wire.CodePoolsIncomplete, Severity: wire.SeverityWarning, Message: IncompleteMessage(found, expected, from, missing) +
		". Until they do, the smallest pool is unknown: no smallest/largest ratio is given, and the set is not judged balanced."}
}

// ExpectedRanks is how many data-parallel ranks e runs: what the agent
// says, or (from an older agent) its launch arguments' data_parallel_size.
func ExpectedRanks(e wire.Engine) int {
	n := e.ExpectedRanks
	for _, a := range e.LaunchArgs {
		if v, ok := strings.CutPrefix(a, "data_parallel_size="); ok {
			if dp, err := strconv.Atoi(v); err == nil && dp <= wire.MaxRanks {
				n = max(n, dp)
			}
		}
	}
	return n
}

// PoolsUnknown warns when no pool of any rank is known although one
// matters: the engine's start-up log is configured but cannot be read, or
// a ready engine runs several data-parallel ranks (whose pools may differ
// eightfold) and nothing reported a pool. A warning, not a hold: the
// pools may well be even.
func PoolsUnknown(e wire.Engine) *Finding {
	if len(e.Ranks) > 0 {
		return nil
	}
	if l := e.LogSource; l != nil && l.Error != "" {
		return &Finding{Code: wire.CodePoolsUnknown, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
			"the engine's start-up log (%s) cannot be read: %s. No KV pool of any rank is known, so heft cannot tell whether the data-parallel pools are even. "+
				"heft-agent inspect on the node shows what the agent tries to read; heft-agent pools --log %s checks a fix.", l.Spec, l.Error, l.Spec)}
	}
	n := ExpectedRanks(e)
	if n < 2 || !e.Ready {
		return nil
	}
	where := "no start-up log is configured and the engine's endpoints report no per-rank pool"
	if l := e.LogSource; l != nil {
		where = fmt.Sprintf("its start-up log (%s, %s lines read) has printed no KV pool line", l.Spec, Thousands(l.Lines))
	}
	return &Finding{Code: wire.CodePoolsUnknown, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
		"the engine runs %d data-parallel ranks but no KV pool of any is known: %s. heft cannot tell whether the pools are even, so a rank with an eighth of the others' pool would go unseen. "+
			"Give the agent the engine's start-up log with log = ... in its [[engine]]: a file, journald:UNIT, docker:CONTAINER or k8s:NAMESPACE/POD/CONTAINER.", n, where)}
}

// disagreeShare is how far apart two readings of one pool may be and
// still count as the same: rounding and page alignment, not another run.
const disagreeShare = 0.01

// PoolsDisagree warns when the pools read from the log differ, beyond
// rounding, from those the engine's own endpoints report per rank (where
// they are truthful: SGLang's sglang:max_total_num_tokens{dp_rank},
// /v1/loads, /server_info). Both figures are named. Ranks one side lacks
// are the concern of pools_incomplete, not this.
func PoolsDisagree(e wire.Engine) *Finding {
	c := e.PoolCheck
	if c == nil || len(e.Ranks) == 0 {
		return nil
	}
	theirs := make(map[int]int64, len(c.Ranks))
	for _, r := range c.Ranks {
		theirs[r.DPRank] = r.KVTokens
	}
	var parts []string
	for _, r := range e.Ranks {
		m, ok := theirs[r.DPRank]
		if !ok || m <= 0 || r.KVTokens <= 0 {
			continue // not reported yet, or not at all
		}
		if diff := r.KVTokens - m; float64(max(diff, -diff)) <= disagreeShare*float64(max(r.KVTokens, m)) {
			continue
		}
		parts = append(parts, fmt.Sprintf("rank %d: %s tokens in the log, %s in %s", r.DPRank, Thousands(r.KVTokens), Thousands(m), checkName(c.Source)))
	}
	if len(parts) == 0 {
		return nil
	}
	if len(parts) > 4 {
		parts = append(parts[:4], fmt.Sprintf("and %d more ranks", len(parts)-4))
	}
	src := e.RanksSource
	if src == "" {
		src = "the start-up log"
	}
	return &Finding{Code: wire.CodePoolsDisagree, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
		"the start-up log (%s) and the engine's %s disagree on the KV pools: %s. One of them is not this engine's current run: "+
			"a log of another engine, or of an earlier start-up. The pools shown are the log's until they agree; check the engine's log = ... (heft-agent inspect shows what is read).",
		src, checkName(c.Source), strings.Join(parts, "; "))}
}

// checkName says where a PoolCheck came from, in words.
func checkName(source string) string {
	switch source {
	case "metrics":
		return "/metrics"
	case "v1_loads":
		return "/v1/loads"
	case "server_info":
		return "/server_info"
	}
	return source
}

// RankList writes ranks as "1, 3" or "2-5", shortening runs.
func RankList(ranks []int) string {
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		switch {
		case j == i:
			parts = append(parts, strconv.Itoa(ranks[i]))
		case j == i+1:
			parts = append(parts, strconv.Itoa(ranks[i]), strconv.Itoa(ranks[j]))
		default:
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

func ordinal(n int) string {
	switch n {
	case 2:
		return "second"
	case 3:
		return "third"
	case 4:
		return "fourth"
	default:
		return fmt.Sprintf("%dth", n)
	}
}
