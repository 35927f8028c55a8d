package enginelog

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"heft/shared/health"
	"heft/shared/wire"
)

// Tracker gathers facts from a log fed line by line. It is safe for
// concurrent use: a follower feeds it while a collector reads Facts.
//
// A log file often holds several start-ups (the server crashed or was
// restarted and appended to the same file). Facts describe the latest:
//
//   - A start-up marker, the version banner or the launch-args line
//     (vLLM "non-default args: {...}" or "args: Namespace(...)", SGLang
//     "server_args=ServerArgs(...)"), begins a new start-up when the current
//     one already has pools, has said it is ready, or has already shown a
//     marker of the same kind.
//   - A vLLM engine core announcing itself ("Initializing a V1 LLM engine")
//     begins a new start-up when its DP rank already has a pool.
//   - A new start-up drops every fact of the previous one: pools, launch
//     args, version, model and readiness.
//
// Within one start-up, several pool lines for the same DP rank (SGLang
// prints one per TP rank, and both "KV Cache is allocated" and
// "max_total_num_tokens") fold into one pool: the preferred format wins
// (SGLang's scheduler figure max_total_num_tokens, then the allocation
// line), and lines of one format that disagree give their minimum, as the
// engine clamps its TP ranks to the smallest, with a note.
type Tracker struct {
	mu       sync.Mutex
	gr       *Grammar
	gen      *generation
	startups int
	// carried: the file was truncated or replaced (Reset) and the new
	// content has shown no start-up yet, so gen is from the old content.
	carried bool
	// pendingDP is a DP size from a command line seen after the current
	// start-up had pools: it belongs to the next start-up.
	pendingDP int
	// prev is the start-up the current one replaced, when it had pools.
	prev *generation
	// actorDP is the DP rank each Ray actor whose name carries no rank
	// said it runs (EventActorRank), by the actor's prefix; bounded by
	// maxActors.
	actorDP map[string]int
}

// maxPorts bounds the server ports one start-up remembers.
const maxPorts = 64

// maxActors bounds Tracker.actorDP: a log names as many engine actors as
// it has DP ranks, at most wire.MaxRanks per start-up.
const maxActors = 4096

type generation struct {
	begun                 bool
	versionSeen, argsSeen bool
	ready                 bool
	version               string
	args                  map[string]string
	argsErr               string
	// model by source, best first: launch args, version banner, engine init.
	model        [3]string
	pools        map[int]map[string]*poolVals // DP rank → format → values
	droppedRanks int
	// topRank is the highest DP rank any line of this start-up named,
	// -1 before one did; cmdlineDP a DP size read from a command line.
	topRank   int
	cmdlineDP int
	// dpNamed: a line named its rank in a way that exists only with data
	// parallelism; cmdlineDPUnknown: a command line gave the DP size as a
	// shell variable. Either with no DP size read makes the count unknown.
	dpNamed, cmdlineDPUnknown bool
	// router is SGLang router workers announced by a command line (-1: an
	// unknown number); ports are the distinct SGLang server ports whose
	// launch args this start-up showed: more than one is several servers.
	router int
	ports  []string
	// streams are, by DP rank, the streams pool lines named for each cell
	// count (Event.Cells → Event.Streams; -1 where they disagree), for
	// Grammar.PerStream figures.
	streams map[int]map[int64]int64
}

func newGeneration(begun bool) *generation {
	return &generation{begun: begun, topRank: -1}
}

// poolVals are the values one format gave for one rank.
type poolVals struct {
	min, max int64
	lines    int
	// namedStreams: a line of this format named its cache's streams.
	namedStreams bool
	// byTP holds each TP rank's latest value, for a format whose later
	// line replaces the same TP rank's earlier one (Grammar.Resized).
	byTP map[int]int64
}

// set records v as TP rank tp's value, replacing its earlier one.
func (pv *poolVals) set(tp int, v int64) {
	if pv.byTP == nil {
		pv.byTP = make(map[int]int64)
	}
	pv.byTP[tp] = v
	pv.min, pv.max, pv.lines = v, v, len(pv.byTP)
	for _, x := range pv.byTP {
		pv.min, pv.max = min(pv.min, x), max(pv.max, x)
	}
}

// maxNotes bounds Facts.Notes.
const maxNotes = 16

// NewTracker returns an empty tracker of a log written in grammar g.
func NewTracker(g *Grammar) *Tracker {
	return &Tracker{gr: g, gen: newGeneration(false)}
}

// Feed reads one line (with or without its line ending).
func (t *Tracker) Feed(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	scanLine(t.gr, line, t.apply, t.rank)
}

// rank records that a line of DP rank dp was seen in this start-up.
func (t *Tracker) rank(dp int, dpOnly bool) {
	t.gen.topRank = max(t.gen.topRank, dp)
	t.gen.dpNamed = t.gen.dpNamed || dpOnly || dp > 0
}

// Reset is called when the followed file was truncated or replaced. The
// facts read so far stay available, flagged FromPreviousFile, because a
// rotated log usually belongs to the same running engine; the first
// start-up marker or pool line of the new content replaces them.
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen.begun || t.gen.ready {
		t.carried = true
	}
}

func (t *Tracker) apply(ev Event) {
	if ev.Actor != "" {
		if ev.Kind == EventActorRank {
			if t.actorDP == nil {
				t.actorDP = map[string]int{}
			}
			if _, ok := t.actorDP[ev.Actor]; ok || len(t.actorDP) < maxActors {
				t.actorDP[ev.Actor] = ev.DPRank
			}
			t.rank(ev.DPRank, true)
			return
		}
		if dp, ok := t.actorDP[ev.Actor]; ok {
			ev.DPRank = dp
		}
	}
	switch ev.Kind {
	case EventVersion:
		t.startup(t.gen.versionSeen)
		g := t.gen
		g.versionSeen = true
		g.version = ev.Version
		g.model[1] = ev.Model
	case EventLaunchArgs:
		port := ev.Args[t.gr.ServerPort]
		if g := t.gen; t.gr.ServerPort != "" && g.argsSeen && port != "" && len(g.ports) > 0 && !slices.Contains(g.ports, port) && !g.ready {
			// Another server's launch args (a router's worker, or two
			// engines writing to one log), not a restart: a restart
			// serves on the same port. Past maxPorts, "several" is all
			// that the count says, and a log of endless ports costs no
			// more.
			if len(g.ports) < maxPorts {
				g.ports = append(g.ports, port)
			}
			return
		}
		t.startup(t.gen.argsSeen)
		g := t.gen
		if port != "" {
			g.ports = append(g.ports, port)
		}
		g.argsSeen = true
		g.args, g.argsErr = ev.Args, ev.ArgsErr
		g.model[0] = ev.Model
		if ev.Version != "" {
			g.version = ev.Version
		}
	case EventEngineInit:
		_, has := t.gen.pools[ev.DPRank]
		t.begin(has)
		g := t.gen
		if g.version == "" {
			g.version = ev.Version
		}
		if g.model[2] == "" {
			g.model[2] = ev.Model
		}
	case EventPool:
		t.begin(false)
		t.gen.addPool(ev, slices.Contains(t.gr.Resized, ev.Format))
	case EventReady:
		t.gen.ready = true
	case EventDPSize:
		// A launch script echoes its command before the engine starts: once
		// the current start-up has pools, it announces the next one.
		if len(t.gen.pools) > 0 || t.gen.ready {
			t.pendingDP = ev.DPSize
		} else {
			t.gen.setCmdlineDP(ev.DPSize)
		}
	case EventRouter:
		t.gen.router = ev.DPSize
	}
}

// startup handles a start-up marker; seen says whether the current
// start-up already showed one of its kind.
func (t *Tracker) startup(seen bool) {
	g := t.gen
	t.begin(seen || len(g.pools) > 0 || g.ready)
}

// begin starts a new generation when fresh is set or the facts are carried
// over from a previous file, and otherwise counts the current one as begun.
func (t *Tracker) begin(fresh bool) {
	if fresh || t.carried {
		if len(t.gen.pools) > 0 {
			t.prev = t.gen
		}
		t.gen = newGeneration(true)
		t.gen.setCmdlineDP(t.pendingDP)
		t.pendingDP = 0
		t.startups++
		t.carried = false
		return
	}
	if !t.gen.begun {
		t.gen.begun = true
		t.startups++
	}
}

// setCmdlineDP records a command line's DP size: n > 0, or -1 for one a
// shell variable hides; 0 is none.
func (g *generation) setCmdlineDP(n int) {
	g.cmdlineDP, g.cmdlineDPUnknown = max(n, 0), n < 0
}

func (g *generation) addPool(ev Event, resized bool) {
	v := ev.KVTokens
	if ev.Blocks != 0 {
		v = ev.Blocks
	}
	if v < 0 || ev.DPRank < 0 {
		return
	}
	if g.pools == nil {
		g.pools = make(map[int]map[string]*poolVals)
	}
	byFormat, ok := g.pools[ev.DPRank]
	if !ok {
		if len(g.pools) >= wire.MaxRanks {
			g.droppedRanks++
			return
		}
		byFormat = make(map[string]*poolVals)
		g.pools[ev.DPRank] = byFormat
	}
	pv, ok := byFormat[ev.Format]
	switch {
	case resized:
		if !ok {
			pv = &poolVals{}
			byFormat[ev.Format] = pv
		}
		pv.set(ev.TPRank, v)
	case !ok:
		byFormat[ev.Format] = &poolVals{min: v, max: v, lines: 1}
	default:
		pv.min, pv.max, pv.lines = min(pv.min, v), max(pv.max, v), pv.lines+1
	}
	if ev.Streams > 0 {
		byFormat[ev.Format].namedStreams = true
		g.noteStreams(ev.DPRank, ev.Cells, ev.Streams)
	}
}

// maxCellCounts bounds the cell counts kept per rank: a start-up prints a
// line per cache, a few.
const maxCellCounts = 64

// noteStreams records that a line of rank dp named streams for cells;
// lines that disagree leave the count unknown (-1).
func (g *generation) noteStreams(dp int, cells, streams int64) {
	if g.streams == nil {
		g.streams = make(map[int]map[int64]int64)
	}
	byCells := g.streams[dp]
	if byCells == nil {
		byCells = make(map[int64]int64)
		g.streams[dp] = byCells
	}
	switch s, ok := byCells[cells]; {
	case ok && s != streams:
		byCells[cells] = -1
	case !ok && len(byCells) < maxCellCounts:
		byCells[cells] = streams
	}
}

// bestPool is rank dp's figure from its best format. A per-stream figure
// (Grammar.PerStream) counts once a line named its cells' streams; until
// then the lines that named streams are passed over too, as they are the
// caches' own and their smallest is not the pool. Without a figure, the
// format is the per-stream one that was passed over, if any.
func (g *generation) bestPool(gr *Grammar, dp int) (string, *poolVals, int64, bool) {
	unsure := ""
	for _, format := range gr.Formats {
		pv, ok := g.pools[dp][format]
		if !ok || unsure != "" && pv.namedStreams {
			continue
		}
		if !slices.Contains(gr.PerStream, format) {
			return format, pv, pv.min, true
		}
		if s := g.streams[dp][pv.min]; s > 0 && pv.min <= math.MaxInt64/s {
			return format, pv, pv.min * s, true
		}
		if unsure == "" {
			unsure = format
		}
	}
	return unsure, nil, 0, false
}

// Facts returns the latest start-up's facts; ok is false until a pool line
// was seen.
func (t *Tracker) Facts() (Facts, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.factsOf(t.gen)
}

// previousFacts are the facts of the start-up the current one replaced,
// when it had pools and the current one has shown no pool, engine core or
// readiness since: the marker that began it may be a launch-args line
// pasted after the pools (out of order) rather than a restart. ok is
// false otherwise.
func (t *Tracker) previousFacts() (Facts, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.gen
	if t.prev == nil || len(g.pools) > 0 || g.ready || g.topRank >= 0 {
		return Facts{}, false
	}
	f, ok := t.factsOf(t.prev)
	f.Notes = append(f.Notes, "the log's last start-up marker (launch args or version banner) comes after these pools and no pool line follows it: "+
		"a log pasted out of order, or a restart that has not sized its KV cache yet; these pools are from before it")
	return f, ok
}

func (t *Tracker) factsOf(g *generation) (Facts, bool) {
	f := Facts{
		Engine:           t.gr.Kind,
		Version:          g.version,
		Ready:            g.ready,
		Startups:         t.startups,
		Restarts:         max(t.startups-1, 0),
		FromPreviousFile: t.carried,
		LaunchArgs:       maps.Clone(g.args),
		DPSize:           dpSize(t.gr.DPKey, g.args),
		BannerOnly: g.versionSeen && !g.argsSeen && !t.carried && len(g.pools) == 0 && !g.ready &&
			g.model[2] == "" && g.topRank < 0,
	}
	for _, m := range g.model {
		if m != "" {
			f.Model = m
			break
		}
	}
	note := func(format string, args ...any) {
		if len(f.Notes) < maxNotes {
			f.Notes = append(f.Notes, fmt.Sprintf(format, args...))
		}
	}
	if g.argsErr != "" {
		note("launch args could not be read whole (%s); kept the %d read before the problem", g.argsErr, len(g.args))
	}
	blockSize, blockNote := g.blockSize(t.gr)
	var formats []string
	for _, dp := range slices.Sorted(maps.Keys(g.pools)) {
		format, pv, tokens, ok := g.bestPool(t.gr, dp)
		if !ok {
			if format != "" {
				note("DP rank %d: %s names one stream's cells and no line says how many streams the cache keeps; the pool is unknown until one does", dp, format)
			}
			continue
		}
		unit := "tokens"
		if format == t.gr.BlockFormat {
			unit = "blocks"
			if tokens > math.MaxInt64/blockSize {
				note("DP rank %d: %d GPU blocks of %d tokens overflow; rank skipped", dp, tokens, blockSize)
				continue
			}
			tokens *= blockSize
		}
		if pv.min != pv.max {
			note("DP rank %d: %d %s lines disagree (%d to %d %s); kept the smallest, as the engine clamps its tensor-parallel ranks to the smallest",
				dp, pv.lines, format, pv.min, pv.max, unit)
		}
		f.Ranks = append(f.Ranks, wire.Rank{DPRank: dp, KVTokens: tokens})
		if !slices.Contains(formats, format) {
			formats = append(formats, format)
		}
	}
	f.Format = strings.Join(formats, ",")
	if t.gr.BlockFormat != "" && slices.Contains(formats, t.gr.BlockFormat) {
		note("%s", blockNote)
	}
	if g.droppedRanks > 0 {
		note("%d pool lines of ranks beyond the first %d were ignored", g.droppedRanks, wire.MaxRanks)
	}
	if n := g.servers(); n != 0 {
		// Several servers in one log: their lines carry TP tags only, so
		// no pool line can be told to belong to one of them, and merging
		// them into one rank would hide the uneven pair heft looks for.
		f.Servers, f.Ranks, f.Format = n, nil, ""
		f.RankCountUnknown = SeveralServersMessage(n)
		note("%s", f.RankCountUnknown)
		return f, false
	}
	f.ExpectedRanks, f.ExpectedFrom = g.expectedRanks(t.gr.DPKey, f.DPSize)
	// Launch args read whole that leave the DP size at its default say one
	// rank, unless a line names a higher one (then they contradict it).
	argsSayOne := t.gr.ArgsOmitDefaultDP && g.argsSeen && g.argsErr == "" &&
		f.DPSize == 0 && g.topRank <= 0 && !g.cmdlineDPUnknown
	if f.DPSize == 0 && g.cmdlineDP == 0 && !argsSayOne && (g.dpNamed || g.cmdlineDPUnknown) {
		f.RankCountUnknown = "the log shows data parallelism (" + g.dpEvidence() + ") but not how many ranks there are " +
			"(no launch args or command line giving the DP size): completeness is unknown"
	}
	if t.gr.SharedPools != nil && t.gr.SharedPools(g.args) {
		f.Ranks = sharedPools(f.Ranks, f.ExpectedRanks, t.gr.SharedPoolsWhy, note)
	}
	f.MissingRanks = missingRanks(f.Ranks, f.ExpectedRanks)
	f.Complete = len(f.Ranks) > 0 && len(f.MissingRanks) == 0 && f.RankCountUnknown == ""
	if f.RankCountUnknown != "" {
		note("%s", f.RankCountUnknown)
	} else if msg := IncompleteMessage(f); msg != "" {
		note("%s", msg)
	}
	if mn := multiNode(t.gr.MultiNodeKeys, g.args); mn != "" {
		f.MultiNode = mn
		note("multi-node launch (%s): this log holds this node's ranks only; the other nodes' logs hold the rest", mn)
	}
	return f, len(f.Ranks) > 0
}

// servers is how many separate servers this start-up's log shows: SGLang
// router workers (-1 when the command line hides their number) or several
// servers' launch args; 0 for one server.
func (g *generation) servers() int {
	switch {
	case len(g.ports) > 1:
		return max(len(g.ports), g.router)
	case g.router > 1 || g.router < 0:
		return g.router
	}
	return 0
}

// SeveralServersMessage explains why a log of several servers gives no pools.
func SeveralServersMessage(n int) string {
	count := fmt.Sprintf("%d", n)
	if n < 0 {
		count = "several (how many, the log does not say)"
	}
	return "this log holds " + count + " separate servers (SGLang router workers, or engines writing to one log): " +
		"each is a worker of its own, and their lines do not say which server printed them, so no pool line can be told to belong to one of them; " +
		"read each server's own log, or point an agent at each server"
}

// dpEvidence says what showed data parallelism, for messages.
func (g *generation) dpEvidence() string {
	if g.cmdlineDPUnknown {
		return "a command line whose DP size is a shell variable"
	}
	return fmt.Sprintf("lines named for DP rank %d", g.topRank)
}

// sharedPools gives every DP rank without a pool line the pool the others
// printed, for an engine that sizes its ranks' pools together (the
// grammar's SharedPools, say SGLang's DP attention; why says so). Ranks
// that printed different figures contradict that, and nothing is filled
// in.
func sharedPools(ranks []wire.Rank, expected int, why string, note func(string, ...any)) []wire.Rank {
	if len(ranks) == 0 || len(ranks) >= expected {
		return ranks
	}
	v := ranks[0].KVTokens
	for _, r := range ranks {
		if r.KVTokens != v {
			note("DP attention: the ranks that printed a pool disagree (%d and %d tokens), so the others are left missing", v, r.KVTokens)
			return ranks
		}
	}
	have := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		have[r.DPRank] = true
	}
	var filled []int
	for dp := range expected {
		if !have[dp] {
			ranks = append(ranks, wire.Rank{DPRank: dp, KVTokens: v})
			filled = append(filled, dp)
		}
	}
	slices.SortFunc(ranks, func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
	note("DP attention: DP %s printed no pool line; %s, so each holds the %d tokens the others printed",
		health.RankList(filled), why, v)
	return ranks
}

// multiNode describes a multi-node launch from the launch args; "" when
// they show none.
func multiNode(keys []string, args map[string]string) string {
	var parts []string
	for _, k := range keys {
		v, ok := args[k]
		if !ok || v == "None" || v == "False" || (k == "nnodes" && v == "1") {
			continue
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ", ")
}

// IncompleteMessage says which ranks of an incomplete set have no pool,
// and why that may be; "" for a complete set or one without pools. It is
// one of f.Notes, and the message of a pools_incomplete warning.
func IncompleteMessage(f Facts) string {
	if f.Complete || len(f.Ranks) == 0 {
		return ""
	}
	return health.IncompleteMessage(len(f.Ranks), f.ExpectedRanks, f.ExpectedFrom, f.MissingRanks)
}

// expectedRanks is how many DP ranks the start-up has, and what says so.
func (g *generation) expectedRanks(key string, argsDP int) (int, string) {
	n, from := 0, ""
	consider := func(v int, why string) {
		if v > n {
			n, from = v, why
		}
	}
	consider(argsDP, fmt.Sprintf("the launch args say %s=%d", key, argsDP))
	consider(g.cmdlineDP, fmt.Sprintf("a command line in the log says %d", g.cmdlineDP))
	consider(g.topRank+1, fmt.Sprintf("a line prefixed DP%d", g.topRank))
	if len(g.pools) > 0 {
		top := slices.Max(slices.Collect(maps.Keys(g.pools)))
		consider(top+1, fmt.Sprintf("a pool for DP%d", top))
	}
	if n > wire.MaxRanks {
		n, from = wire.MaxRanks, from+fmt.Sprintf(" (counted up to %d)", wire.MaxRanks)
	}
	return n, from
}

// missingRanks lists the ranks below expected that have no pool.
func missingRanks(ranks []wire.Rank, expected int) []int {
	var out []int
	have := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		have[r.DPRank] = true
	}
	for dp := range expected {
		if !have[dp] {
			out = append(out, dp)
		}
	}
	return out
}

// blockSize is the block size of gr's block format, from the launch args
// or else the kind's default.
func (g *generation) blockSize(gr *Grammar) (int64, string) {
	def := max(gr.DefaultBlockSize, 1)
	s, ok := g.args[gr.BlockSizeKey]
	if !ok || s == "None" {
		return def, fmt.Sprintf("pool = GPU blocks × %d tokens, %s's default block size (no %s in the launch args)", def, gr.Kind, gr.BlockSizeKey)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > 1<<20 {
		return def, fmt.Sprintf("pool = GPU blocks × %d tokens, %s's default block size (%s %q in the launch args is not a usable number)", def, gr.Kind, gr.BlockSizeKey, s)
	}
	return n, fmt.Sprintf("pool = GPU blocks × %d tokens (%s from the launch args)", n, gr.BlockSizeKey)
}

// dpSize reads the data-parallel size from the launch arg key.
func dpSize(key string, args map[string]string) int {
	n, err := strconv.Atoi(args[key])
	if err != nil || n < 1 || n > wire.MaxRanks {
		return 0
	}
	return n
}
