package fleet

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/shared/health"
	"heft/shared/view"
	"heft/shared/wire"
)

// A multi-node data-parallel deployment runs its DP ranks on several
// nodes (vLLM --data-parallel-size-local / --headless /
// --data-parallel-start-rank, SGLang --nnodes / --node-rank), and each
// node's agent sees its own ranks only. Workers of one model whose launch
// arguments name the same data-parallel address (vLLM
// data_parallel_address:data_parallel_rpc_port or master_addr:master_port,
// SGLang dist_init_addr) are one deployment: their ranks are judged as one
// set (imbalance, hold, completeness, the smallest pool) on every node's
// worker.

// span is the part of a multi-node deployment one worker runs.
type span struct {
	key   string // model and data-parallel address
	addr  string // the data-parallel address
	size  int    // data_parallel_size, 0 when the args do not say
	start int    // first DP rank on this node
	local int    // DP ranks on this node, 0 when the args do not say
}

// DeploymentGrace is how long a deployment may miss a node before the
// warning says the node has not reported rather than not yet.
const DeploymentGrace = 2 * time.Minute

// spanOf reads a worker's part of a multi-node deployment from its launch
// arguments; ok is false for a single-node engine.
func spanOf(e wire.Engine) (span, bool) {
	args := make(map[string]string, len(e.LaunchArgs))
	for _, a := range e.LaunchArgs {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		args[strings.ReplaceAll(k, "-", "_")] = v
	}
	num := func(k string) int {
		n, err := strconv.Atoi(args[k])
		if err != nil || n < 0 || n > wire.MaxRanks {
			return 0
		}
		return n
	}
	addr := ""
	switch {
	case args["data_parallel_address"] != "":
		addr = args["data_parallel_address"] + ":" + args["data_parallel_rpc_port"]
	case args["dist_init_addr"] != "":
		addr = args["dist_init_addr"]
	case args["master_addr"] != "":
		addr = args["master_addr"] + ":" + args["master_port"]
	}
	s := span{size: num("data_parallel_size"), local: num("data_parallel_size_local"), start: num("data_parallel_start_rank")}
	nnodes, nodeRank := num("nnodes"), num("node_rank")
	if s.local == 0 && nnodes > 1 && s.size > 0 {
		s.local = s.size / nnodes
	}
	if args["data_parallel_start_rank"] == "" && nodeRank > 0 && s.local > 0 {
		s.start = nodeRank * s.local
	}
	multi := nnodes > 1 || args["headless"] == "true" || (s.local > 0 && (s.size == 0 || s.local < s.size)) || s.start > 0
	if addr == "" || !multi {
		return span{}, false
	}
	s.key, s.addr = e.Model+"\x00"+addr, addr
	return s, true
}

// deployment lists the workers of w's multi-node deployment, w included,
// ordered by their first rank then node; nil when w runs on one node.
func (f *Fleet) deployment(w *worker) []*worker {
	s, ok := spanOf(w.eng)
	if !ok || w.placeholder {
		return nil
	}
	var out []*worker
	for _, o := range f.byModel[w.eng.Model] {
		if os, ok := spanOf(o.eng); ok && !o.placeholder && os.key == s.key {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b *worker) int {
		sa, _ := spanOf(a.eng)
		sb, _ := spanOf(b.eng)
		if sa.start != sb.start {
			return sa.start - sb.start
		}
		return strings.Compare(a.node+a.id, b.node+b.id)
	})
	return out
}

// withDeployments adds to ws the other workers of their deployments, so a
// node's report re-derives every node's worker of the deployment.
func (f *Fleet) withDeployments(ws []*worker) []*worker {
	out := ws
	for _, w := range ws {
		for _, o := range f.deployment(w) {
			if !slices.Contains(out, o) {
				out = append(out, o)
			}
		}
	}
	return out
}

// joined is the engine w is judged as: its own, or, for a worker of a
// multi-node deployment, its own with the ranks of every node's worker,
// expected ranks and completeness over the whole deployment. The findings
// say which nodes make it up, and which disagree or have not reported.
func (f *Fleet) joined(w *worker, now time.Time) (wire.Engine, []health.Finding) {
	members := f.deployment(w)
	if len(members) == 0 {
		return w.eng, nil
	}
	own, _ := spanOf(w.eng)
	var parts, disagree []string
	size := own.size
	ranks := map[int]wire.Rank{}
	from := map[int]string{}
	earliest := w.firstSeen
	for _, m := range members {
		s, _ := spanOf(m.eng)
		parts = append(parts, fmt.Sprintf("%s (DP %s)", m.node, health.RankList(spanRanks(s, m.eng))))
		if m.firstSeen.Before(earliest) {
			earliest = m.firstSeen
		}
		if s.size != 0 && size != 0 && s.size != size {
			disagree = append(disagree, fmt.Sprintf("%s says data_parallel_size=%d, %s says %d", m.node, s.size, w.node, size))
		}
		size = max(size, s.size)
		for _, r := range m.eng.Ranks {
			if prev, dup := from[r.DPRank]; dup && prev != m.node {
				disagree = append(disagree, fmt.Sprintf("DP %d is reported by both %s and %s", r.DPRank, prev, m.node))
				continue
			}
			ranks[r.DPRank], from[r.DPRank] = r, m.node
		}
	}
	fs := []health.Finding{{Code: wire.CodeDeployment, Severity: wire.SeverityInfo,
		Message: "one data-parallel deployment across nodes: " + strings.Join(parts, ", ") +
			"; its pools are judged as one set on each node's worker"}}
	if len(disagree) > 0 {
		slices.Sort(disagree)
		fs = append(fs, health.Finding{Code: wire.CodeDeploymentMismatch, Severity: wire.SeverityWarning,
			Message: "the nodes of one data-parallel deployment disagree: " + strings.Join(slices.Compact(disagree), "; ") +
				". Each node's worker is judged on its own ranks until they agree."})
		return w.eng, fs
	}
	e := w.eng
	e.Ranks = slices.SortedFunc(maps.Values(ranks), func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
	e.ExpectedRanks = min(max(size, len(e.Ranks)), wire.MaxRanks)
	e.MissingRanks = nil
	for dp := range e.ExpectedRanks {
		if _, ok := ranks[dp]; !ok {
			e.MissingRanks = append(e.MissingRanks, dp)
		}
	}
	complete := len(e.MissingRanks) == 0 && len(e.Ranks) > 0
	for _, m := range members {
		// A node whose own log cannot show its ranks' count stays unsure.
		if m.eng.Complete == nil && len(m.eng.Ranks) == 0 {
			complete = false
		}
	}
	e.Complete = &complete
	if len(e.MissingRanks) > 0 {
		when := "not yet"
		if now.Sub(earliest) > DeploymentGrace {
			when = fmt.Sprintf("not in the %s since the first node reported", DeploymentGrace)
		}
		fs = append(fs, health.Finding{Code: wire.CodeDeploymentMismatch, Severity: wire.SeverityWarning,
			Message: fmt.Sprintf("data-parallel deployment of %d ranks: DP %s have %s been reported by any node (reporting: %s)",
				e.ExpectedRanks, health.RankList(e.MissingRanks), when, strings.Join(parts, ", "))})
	}
	return e, fs
}

// spanRanks are the ranks a worker's node runs: its launch args' range, or
// the ranks it reported.
func spanRanks(s span, e wire.Engine) []int {
	var out []int
	if s.local > 0 {
		for dp := s.start; dp < s.start+s.local; dp++ {
			out = append(out, dp)
		}
		return out
	}
	for _, r := range e.Ranks {
		out = append(out, r.DPRank)
	}
	return out
}

// pools is the engine whose pools the worker is judged and shown with:
// its multi-node deployment's, else its own.
func (w *worker) pools() wire.Engine {
	if w.judged != nil {
		return *w.judged
	}
	return w.eng
}

// deploymentView describes w's part of its multi-node deployment for the
// API and the dashboard; nil for a worker on one node.
func (f *Fleet) deploymentView(w *worker) *view.Deployment {
	members := f.deployment(w)
	s, ok := spanOf(w.eng)
	if len(members) == 0 || !ok {
		return nil
	}
	d := &view.Deployment{Address: s.addr, Size: s.size, StartRank: s.start, LocalRanks: s.local}
	for _, m := range members {
		if !slices.Contains(d.Nodes, m.node) {
			d.Nodes = append(d.Nodes, m.node)
		}
	}
	return d
}
