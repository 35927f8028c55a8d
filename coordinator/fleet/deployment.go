package fleet

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/netip"
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
// SGLang dist_init_addr) name one deployment, and a worker is judged
// (imbalance, hold, completeness, the smallest pool) on the ranks of the
// ones it joins.
//
// Those launch arguments are the agents' word, and any node may name any
// address, so a worker joins another node's ranks only where its own node
// said they belong (see deployment): a node's ranks count on another
// node's worker only when they fall inside the data_parallel_size that
// worker's own launch arguments give, inside the range the claimant's own
// arguments give, and on ranks no node trusted before it claims. A
// compromised node can then neither add a starved rank to an honest
// deployment (holding its workers) nor contest one of its ranks (which
// used to judge each worker on its own, never-holding ranks and lift a
// warranted hold).

// span is the part of a multi-node deployment one worker runs.
type span struct {
	addr     string // the data-parallel address (with the model, the deployment)
	host     string // the address's host
	port     string // the address's port, "" when the args give none
	size     int    // data_parallel_size, 0 when the args do not say
	start    int    // first DP rank on this node
	local    int    // DP ranks on this node, 0 when the args do not say
	headless bool   // vLLM --headless, or an SGLang node_rank > 0: not the head
}

// DeploymentGrace is how long a deployment may miss a node before the
// warning says the node has not reported rather than not yet.
const DeploymentGrace = 2 * time.Minute

// spanKeys are the launch arguments spanOf reads.
var spanKeys = [...]string{"data_parallel_address", "data_parallel_rpc_port", "dist_init_addr", "nccl_init_addr", "master_addr", "master_port",
	"data_parallel_size", "dp_size", "data_parallel_size_local", "data_parallel_start_rank", "nnodes", "node_rank", "headless"}

// spanOf reads a worker's part of a multi-node deployment from its launch
// arguments; ok is false for a single-node engine. It is called for every
// worker of a model on each of its deployment's evaluations, so it keeps
// only the few arguments it reads and allocates nothing for the others.
func spanOf(e wire.Engine) (span, bool) {
	var vals [len(spanKeys)]string // by spanKeys' index; the last of a repeated flag wins
	for _, a := range e.LaunchArgs {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if len(k) > len("data_parallel_start_rank") {
			continue
		}
		if i := slices.Index(spanKeys[:], strings.ReplaceAll(k, "-", "_")); i >= 0 {
			vals[i] = v
		}
	}
	args := func(k string) string { return vals[slices.Index(spanKeys[:], k)] }
	num := func(k string) int {
		v := args(k)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > wire.MaxRanks {
			return 0
		}
		return n
	}
	addr, host, port := "", "", ""
	switch {
	case args("data_parallel_address") != "":
		host, port = args("data_parallel_address"), args("data_parallel_rpc_port")
		addr = host + ":" + port
	case cmp.Or(args("dist_init_addr"), args("nccl_init_addr")) != "":
		// --nccl-init-addr: SGLang's older spelling of the same flag.
		addr = cmp.Or(args("dist_init_addr"), args("nccl_init_addr"))
		host = addr
		if h, p, err := net.SplitHostPort(addr); err == nil {
			host, port = h, p
		}
	case args("master_addr") != "":
		host, port = args("master_addr"), args("master_port")
		addr = host + ":" + port
	}
	s := span{size: cmp.Or(num("data_parallel_size"), num("dp_size")), local: num("data_parallel_size_local"), start: num("data_parallel_start_rank")}
	nnodes, nodeRank := num("nnodes"), num("node_rank")
	if s.local == 0 && nnodes > 1 && s.size > 0 {
		s.local = s.size / nnodes
	}
	if args("data_parallel_start_rank") == "" && nodeRank > 0 && s.local > 0 {
		s.start = nodeRank * s.local
	}
	s.headless = args("headless") == "true" || nodeRank > 0
	multi := nnodes > 1 || s.headless || (s.local > 0 && (s.size == 0 || s.local < s.size)) || s.start > 0
	if addr == "" || !multi {
		return span{}, false
	}
	// One deployment, however each node spells its address: [fd00::1]
	// and fd00::1, a name in any case, a port with leading zeros.
	if n, err := strconv.Atoi(port); err == nil && n > 0 && n <= 65535 {
		port = strconv.Itoa(n)
	}
	s.addr, s.host, s.port = net.JoinHostPort(canonicalHost(host), port), host, port
	return s, true
}

// member is a worker naming a deployment, with its span read once: the
// grouping below sorts and compares them without parsing launch
// arguments again.
type member struct {
	w *worker
	s span
	// head: the deployment's head by more than its own word: not
	// headless, and the address it offers gateways, which the server
	// checked is its node's (SetAddressRefusals), is on the
	// data-parallel address's host.
	head bool
	// live: its agent is present (connected, and a snapshot accepted on
	// that connection: node.present). A worker whose node went away stays
	// listed until forgotten (a day); its ranks must not keep out those
	// of a live one (the same engine back under a corrected node name, or
	// on another host). A hostile node gains from this only while the
	// node whose ranks it claims is away.
	live bool
}

// candidates lists the workers naming w's deployment, w first; nil when w
// runs on one node.
func (f *Fleet) candidates(w *worker) []member {
	s, ok := spanOf(w.eng)
	if !ok || w.placeholder {
		return nil
	}
	return f.naming(w, s)
}

// naming lists the workers naming the deployment of w, whose span is s,
// w first.
func (f *Fleet) naming(w *worker, s span) []member {
	out := []member{{w: w, s: s}}
	for _, o := range f.byModel[w.eng.Model] { // one model: the address alone tells deployments apart
		if o == w || o.placeholder {
			continue
		}
		if os, ok := spanOf(o.eng); ok && os.addr == s.addr {
			out = append(out, member{w: o, s: os, head: !os.headless && f.addressOn(o, os.host), live: f.present(o)})
		}
	}
	return out
}

// addressOn reports whether o's gateway address, not refused as another
// node's, is on host.
func (f *Fleet) addressOn(o *worker, host string) bool {
	h, _, err := net.SplitHostPort(Address(o.eng))
	if err != nil || f.addressRefused(o) != "" {
		return false
	}
	a, errA := netip.ParseAddr(h)
	b, errB := netip.ParseAddr(strings.Trim(host, "[]"))
	if errA == nil && errB == nil {
		return a.Unmap() == b.Unmap()
	}
	return strings.EqualFold(h, host)
}

// joinSet is what w is judged with: the members it joins, and why it
// joins no other.
type joinSet struct {
	own     span
	members []member // w and the workers it joins, by first rank then node
	refused []string // why each other worker naming the deployment is not joined
	bound   *binding // the operator's binding of the deployment's address, if any (dpbind.go)
	// unbound: the nodes naming the deployment that its binding leaves
	// out (w's own, when it is one of them), whose ranks are not counted.
	unbound []string
}

// deployment decides which workers naming w's deployment w joins; nil
// when w runs on one node.
//
// The rule: another node's ranks change how w is judged, so they count
// only where w's own node said they belong. w's launch arguments say how
// many ranks there are (data_parallel_size) and which it runs; a member
// whose size differs, whose own arguments put its ranks outside that
// size, or which reports ranks outside its own range contradicts w or
// itself and is not joined. Members that remain are taken in an order a
// late or hostile node cannot jump: w itself, then a head that the
// server's address check ties to the data-parallel address, then the
// workers whose agents are connected, then by when each was first seen;
// one claiming a rank (by its range or its reports) that a member taken
// before it claims is not joined. So a live node that names the
// deployment later can neither widen it, nor add a rank, nor take a live
// node's rank over: what was warranted before it came (a hold included)
// stays, and the warning names it. What no rule here can tell apart is a
// node claiming ranks no other node has claimed yet, before the node that
// runs them reports: it is believed, and its claim wins over the real
// node's when that arrives (both are named in the warning), unless the
// operator bound the address to its nodes (dp_deployment, dpbind.go):
// then a worker on another node is not joined whenever it came, and such
// a worker itself joins no node's ranks.
func (f *Fleet) deployment(w *worker) *joinSet {
	cands := f.candidates(w)
	if cands == nil {
		return nil
	}
	own := cands[0].s
	d := &joinSet{own: own, members: cands[:1]}
	others := slices.Clone(cands[1:])
	if b, ok := f.bindings().bound(own); ok {
		// The operator named the deployment's nodes (dp_deployment):
		// no other node joins, whenever it came.
		d.bound = &b
		nodes := strings.Join(b.nodes, ", ")
		if !slices.Contains(b.nodes, w.node) {
			if len(others) > 0 {
				d.refused = []string{fmt.Sprintf("%s is not bound to %s (dp_deployment binds %s), so this worker joins no other node's ranks",
					w.node, b.addr, nodes)}
				d.unbound = []string{w.node}
			}
			return d
		}
		others = slices.DeleteFunc(others, func(m member) bool {
			if slices.Contains(b.nodes, m.w.node) {
				return false
			}
			d.refused = append(d.refused, fmt.Sprintf("%s is not bound to %s (dp_deployment binds %s), so its ranks are not joined",
				m.w.node, b.addr, nodes))
			d.unbound = append(d.unbound, m.w.node)
			return true
		})
	}
	claimed := map[int]string{}
	for _, dp := range claimOf(cands[0]) {
		claimed[dp] = w.node
	}
	if own.size == 0 && len(others) > 0 {
		// w's own arguments bound nothing: no other node's ranks can be
		// checked against them.
		var nodes []string
		for _, m := range others {
			nodes = append(nodes, m.w.node)
		}
		slices.Sort(nodes)
		d.refused = append(d.refused, fmt.Sprintf("%s's launch arguments do not say data_parallel_size, so the ranks of %s are not joined",
			w.node, strings.Join(slices.Compact(nodes), ", ")))
		return d
	}
	first := func(a, b bool) int { // true first
		switch {
		case a == b:
			return 0
		case a:
			return -1
		}
		return 1
	}
	slices.SortFunc(others, func(a, b member) int {
		return cmp.Or(first(a.head, b.head), first(a.live, b.live), a.w.firstSeen.Compare(b.w.firstSeen),
			strings.Compare(a.w.node, b.w.node), strings.Compare(a.w.id, b.w.id))
	})
	for _, m := range others {
		if why := refusal(own, m, claimed, w.node); why != "" {
			d.refused = append(d.refused, why)
			continue
		}
		d.members = append(d.members, m)
		for _, dp := range claimOf(m) {
			claimed[dp] = m.w.node
		}
	}
	slices.SortFunc(d.members, func(a, b member) int {
		return cmp.Or(a.s.start-b.s.start, strings.Compare(a.w.node+a.w.id, b.w.node+b.w.id))
	})
	return d
}

// claimOf is the ranks a member says it runs: its launch arguments'
// range and the ranks it reported.
func claimOf(m member) []int {
	out := spanRanks(m.s, m.w.eng)
	if m.s.local > 0 {
		for _, r := range m.w.eng.Ranks {
			out = append(out, r.DPRank)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// refusal says why m is not joined to the deployment as the worker on
// node self (whose span is own) sees it, given the ranks the members
// taken before it claim; "" when it is joined.
func refusal(own span, m member, claimed map[int]string, self string) string {
	node := m.w.node
	switch {
	case m.s.size != 0 && m.s.size != own.size:
		return fmt.Sprintf("%s says data_parallel_size=%d, %s says %d", node, m.s.size, self, own.size)
	case m.s.local > 0 && m.s.start+m.s.local > own.size:
		return fmt.Sprintf("%s runs DP %s by its launch arguments, outside the deployment's %d ranks",
			node, health.RankList(spanRanks(m.s, m.w.eng)), own.size)
	}
	var outside, taken []int
	by := ""
	for _, r := range m.w.eng.Ranks {
		if r.DPRank < 0 || r.DPRank >= own.size || (m.s.local > 0 && (r.DPRank < m.s.start || r.DPRank >= m.s.start+m.s.local)) {
			outside = append(outside, r.DPRank)
		}
	}
	if len(outside) > 0 {
		slices.Sort(outside)
		return fmt.Sprintf("%s reports DP %s, outside its own launch arguments' ranks or the deployment's %d",
			node, health.RankList(slices.Compact(outside)), own.size)
	}
	claim := claimOf(m)
	if len(claim) == 0 {
		return fmt.Sprintf("%s names no rank of its own", node)
	}
	for _, dp := range claim {
		if prev, ok := claimed[dp]; ok {
			taken, by = append(taken, dp), prev
		}
	}
	if len(taken) > 0 {
		slices.Sort(taken)
		return fmt.Sprintf("DP %s is reported by both %s and %s (%s's ranks are not joined)", health.RankList(taken), by, node, node)
	}
	return ""
}

// withDeployments adds to ws the other workers naming their deployments,
// so a node's report re-derives every node's worker of the deployment.
// Each deployment is listed once, however many of its workers ws holds.
func (f *Fleet) withDeployments(ws []*worker) []*worker {
	out := ws
	in := make(map[*worker]bool, len(ws))
	for _, w := range ws {
		in[w] = true
	}
	done := map[[2]string]bool{}
	for _, w := range ws {
		s, ok := spanOf(w.eng)
		if !ok || w.placeholder || done[[2]string{w.eng.Model, s.addr}] {
			continue
		}
		done[[2]string{w.eng.Model, s.addr}] = true
		for _, m := range f.naming(w, s) {
			if !in[m.w] {
				in[m.w] = true
				out = append(out, m.w)
			}
		}
	}
	return out
}

// joined is the engine w is judged as: its own, or, for a worker of a
// multi-node deployment, its own with the ranks of the workers it joins
// (deployment), expected ranks and completeness over the whole
// deployment. The findings say which nodes make it up, and which are not
// joined or have not reported.
func (f *Fleet) joined(w *worker, now time.Time) (wire.Engine, []health.Finding) {
	d := f.deployment(w)
	if d == nil {
		return w.eng, nil
	}
	var parts []string
	ranks := map[int]wire.Rank{}
	earliest := w.firstSeen
	for _, m := range d.members {
		parts = append(parts, fmt.Sprintf("%s (DP %s)", m.w.node, health.RankList(spanRanks(m.s, m.w.eng))))
		if m.w.firstSeen.Before(earliest) {
			earliest = m.w.firstSeen
		}
		for _, r := range m.w.eng.Ranks {
			ranks[r.DPRank] = r // members' claims are disjoint (refusal)
		}
	}
	fs := []health.Finding{{Code: wire.CodeDeployment, Severity: wire.SeverityInfo,
		Message: "one data-parallel deployment across nodes: " + strings.Join(parts, ", ") +
			"; its pools are judged as one set on each node's worker"}}
	if len(d.refused) > 0 {
		slices.Sort(d.refused)
		fs = append(fs, health.Finding{Code: wire.CodeDeploymentMismatch, Severity: wire.SeverityWarning,
			Message: "the nodes of one data-parallel deployment disagree: " + strings.Join(slices.Compact(d.refused), "; ") +
				". This worker joins another node's ranks only where its own launch arguments leave room for them and no node joined before claims them" +
				boundNote(d.bound) + "."})
	}
	if d.own.size == 0 {
		return w.eng, fs // its size unknown, nothing bounds a join: judged on its own ranks
	}
	e := w.eng
	e.Ranks = slices.SortedFunc(maps.Values(ranks), func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
	e.ExpectedRanks = min(max(d.own.size, len(e.Ranks)), wire.MaxRanks)
	e.MissingRanks = nil
	for dp := range e.ExpectedRanks {
		if _, ok := ranks[dp]; !ok {
			e.MissingRanks = append(e.MissingRanks, dp)
		}
	}
	complete := len(e.MissingRanks) == 0 && len(e.Ranks) > 0
	for _, m := range d.members {
		// A node whose own log cannot show its ranks' count stays unsure.
		if m.w.eng.Complete == nil && len(m.w.eng.Ranks) == 0 {
			complete = false
		}
	}
	e.Complete = &complete
	if len(e.MissingRanks) > 0 {
		when := "not yet"
		if now.Sub(earliest) > DeploymentGrace {
			when = fmt.Sprintf("not in the %s since the first node reported", DeploymentGrace)
		}
		msg := fmt.Sprintf("data-parallel deployment of %d ranks: DP %s have %s been reported by any node (reporting: %s)",
			e.ExpectedRanks, health.RankList(e.MissingRanks), when, strings.Join(parts, ", "))
		if len(d.unbound) > 0 {
			// Not "by any node": a node the binding leaves out may run
			// them, and the operator's list may be what is wrong.
			slices.Sort(d.unbound)
			msg = fmt.Sprintf("data-parallel deployment of %d ranks: DP %s have %s been reported by any node this worker joins (reporting: %s); "+
				"not counted, as dp_deployment does not bind them to %s: %s. If such a node runs this deployment, add it to the binding's nodes and restart the coordinator",
				e.ExpectedRanks, health.RankList(e.MissingRanks), when, strings.Join(parts, ", "), d.bound.addr, strings.Join(slices.Compact(d.unbound), ", "))
		}
		fs = append(fs, health.Finding{Code: wire.CodeDeploymentMismatch, Severity: wire.SeverityWarning, Message: msg})
	}
	return e, fs
}

// boundNote ends the mismatch warning of a deployment whose address the
// operator bound.
func boundNote(b *binding) string {
	if b == nil {
		return ""
	}
	return ", and only nodes bound to " + b.addr + " by dp_deployment join it"
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
// API and the dashboard: the nodes it joins; nil for a worker on one node.
func (f *Fleet) deploymentView(w *worker) *view.Deployment {
	d := f.deployment(w)
	if d == nil {
		return nil
	}
	s := d.own
	v := &view.Deployment{Address: s.addr, Size: s.size, StartRank: s.start, LocalRanks: s.local}
	for _, m := range d.members {
		if !slices.Contains(v.Nodes, m.w.node) {
			v.Nodes = append(v.Nodes, m.w.node)
		}
	}
	return v
}
