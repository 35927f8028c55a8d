package agent

import (
	"cmp"
	"context"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/agent/config"
	"heft/agent/engine"
	"heft/agent/probe"
	"heft/shared/wire"
)

// PassiveWindow is how long an engine must stay saturated (every rank
// running at least the probe's per-rank burst, with work waiting) for its
// delivered tokens over that time to count as a capacity measurement by
// default; the agent's probe.passive_window setting replaces it.
const PassiveWindow = config.DefaultPassiveWindow

// passiveStill is how long a generated-tokens counter that moves as tokens
// are made (not as requests finish) may stand still while the load reads
// saturated. An engine with requests running makes tokens every step; a
// counter still for this long beside gauges that show work means the
// gauges are stale (vLLM keeps its stats when every request is aborted at
// once: vllm issues #22545 and #29928) or the engine has stalled. Neither
// is a capacity: the window starts over, and none ends on a still sample.
const passiveStill = 2 * time.Second

// passive turns an engine's own counters, read while it is saturated in
// service, into wire.Passive readings: no burst is sent. A sample that is
// not saturated, a counter that went back (a restart) or is summed over
// other ranks, or one more than maxGap after the last starts over.
type passive struct {
	window  time.Duration
	maxGap  time.Duration
	perRank int
	ranks   int

	start, last passiveSample
	// moved is the last sample at which the counter had moved.
	moved      passiveSample
	minRunning int
	rates      []float64
	latest     *wire.Passive
	stillLoad  probe.StillLoad
	// seen is when a snapshot last carried the capacity key (passive and
	// pace trackers are kept and forgotten together: forgetPassive).
	seen time.Time
	// readAt is when the counters the trackers last took were read, or
	// when they last took an idle point (a load that read idle, with no
	// counters read): an answer not newer is never added after it.
	readAt time.Time
}

// An engine that crash-loops with changing arguments gets a new capacity
// key at every start; its trackers are forgotten once no snapshot has
// carried their key for passiveForget, and at most maxPassiveKeys are kept
// (the least recently seen go first). A key that reads "" for a few
// snapshots (the engine was unreachable for a moment) keeps its windows.
const (
	passiveForget  = 10 * time.Minute
	maxPassiveKeys = 64
)

// passiveMaxGap is the longest time between two samples a passive window
// spans. A snapshot that could not read the engine (a /metrics read that
// failed or timed out, or the engine unreachable) leaves a hole in which
// the engine may have stalled or idled, and the window averages it in.
// One such read is a hole of at most the read's 5 s timeout and the 1 s
// poll, and a busy engine's /metrics fails now and then (SGLang's and
// vLLM's answer on the event loop that serves requests): were every hole
// a new start, a saturated engine whose /metrics fails once per window
// would never be read. Two failed reads in a row start over.
const passiveMaxGap = 10 * time.Second

type passiveSample struct {
	at  time.Time
	gen float64
	// ranks are the ranks gen was summed over (counterRanks): a sum over
	// other ranks is another counter.
	ranks string
}

// counterRanks names the ranks an engine's generated-tokens counter was
// summed over (engine.Counters.Ranks), "" where it is one series (rank 0,
// or no rank label). A rank missing from one read and back at the next
// adds all it made since it started: the trackers start over where the
// ranks change, as where the counter went back.
func counterRanks(ranks map[int]float64) string {
	if _, zero := ranks[0]; len(ranks) == 0 || len(ranks) == 1 && zero {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(ranks)) {
		b.WriteString(strconv.Itoa(k))
		b.WriteByte(',')
	}
	return b.String()
}

// saturated: every rank runs at least perRank requests and work waits.
func (p *passive) saturated(l wire.Load) (running int, ok bool) {
	if !l.Known || l.Waiting == 0 || len(l.Ranks) < p.ranks {
		return 0, false
	}
	for _, r := range l.Ranks {
		if r.Running < p.perRank {
			return 0, false
		}
		running += r.Running
	}
	return running, true
}

// add takes one reading of the counters; it returns the reading a window
// completed, else nil (Latest keeps the newest).
func (p *passive) add(at time.Time, c engine.Counters) *wire.Passive {
	running, ok := p.saturated(c.Load)
	ranks := counterRanks(c.Ranks)
	still := c.GeneratedLive && c.Generated == p.moved.gen
	if still && !p.start.at.IsZero() && at.Sub(p.moved.at) >= passiveStill {
		ok = false
	}
	hole := !p.last.at.IsZero() && at.Sub(p.last.at) > cmp.Or(p.maxGap, passiveMaxGap)
	if !ok || p.start.at.IsZero() || c.Generated < p.last.gen || ranks != p.last.ranks || hole {
		p.unseen()
		if ok {
			first := passiveSample{at, c.Generated, ranks}
			p.start, p.last, p.moved, p.minRunning = first, first, first, running
		}
		return nil
	}
	if dt := at.Sub(p.last.at).Seconds(); dt > 0 {
		p.rates = append(p.rates, (c.Generated-p.last.gen)/dt)
	}
	p.last, p.minRunning = passiveSample{at, c.Generated, ranks}, min(p.minRunning, running)
	if !still {
		p.moved = p.last
	}
	span := p.last.at.Sub(p.start.at)
	if span < p.window || len(p.rates) == 0 || still {
		return nil
	}
	lo, hi, sum := math.Inf(1), 0.0, 0.0
	for _, r := range p.rates {
		lo, hi, sum = min(lo, r), max(hi, r), sum+r
	}
	mean := sum / float64(len(p.rates))
	spread := 0.0
	if mean > 0 {
		spread = (hi - lo) / mean
	}
	r := &wire.Passive{At: at.UTC(), WindowSeconds: span.Seconds(), ThroughputTPS: (p.last.gen - p.start.gen) / span.Seconds(),
		Concurrency: p.minRunning, Spread: spread}
	p.latest = r
	// The next window starts where this one ended.
	p.start, p.rates, p.minRunning = p.last, p.rates[:0], running
	return r
}

// unseen starts the window over (its last reading stays).
func (p *passive) unseen() {
	p.rates = p.rates[:0]
	p.start, p.last, p.moved, p.minRunning = passiveSample{}, passiveSample{}, passiveSample{}, 0
}

// stillFor follows, in snapshots, a load that reads busy for one the
// engine stopped updating, by the rule a probe keeps before it defers
// (probe.StillLoad): it returns how long c's load and counters have stood
// still as of at; 0 while they move, where the load reads idle, or where
// the kind's counters move only as requests finish (no proof then).
func stillFor(w *probe.StillLoad, at time.Time, c engine.Counters) time.Duration {
	stir, live := c.Stir()
	if !live || c.Load.Running+c.Load.Waiting == 0 {
		w.Reset()
		return 0
	}
	return w.Observe(at, c.Load, stir)
}

// passiveReadings keeps one passive and one pace tracker per capacity key
// and fills each engine's Passive and Pace in a snapshot, reading the
// counters only of engines that run requests or whose pace window runs
// (within a snapshot the /metrics answer its facts read, where they read
// the engine in full: engine.ShareReads; else one /metrics read).
func (h *Handler) passiveReadings(ctx context.Context, s *wire.Snapshot) {
	h.passiveMu.Lock() // its own lock: a counter read must not hold up probes
	defer h.passiveMu.Unlock()
	if h.passive == nil {
		h.passive, h.paces = map[string]*passive{}, map[string]*pace{}
	}
	seen := time.Now()
	defer h.forgetPassive(seen)
	for i := range s.Engines {
		e := &s.Engines[i]
		if e.CapacityKey == "" {
			continue
		}
		p := h.passive[e.CapacityKey]
		if p == nil {
			p = &passive{window: h.passiveWindow, maxGap: h.passiveGap, perRank: h.cfg.Probe.Concurrency}
			if p.window == 0 {
				p.window = h.cfg.Probe.PassiveWindow
			}
			if p.window == 0 {
				p.window = PassiveWindow
			}
			h.passive[e.CapacityKey] = p
		}
		p.ranks, p.seen = e.DataParallelRanks(), seen
		pc := h.paces[e.CapacityKey]
		if pc == nil {
			pc = &pace{window: cmp.Or(h.passiveWindow, h.cfg.Probe.PaceWindow, config.DefaultPaceWindow)}
			h.paces[e.CapacityKey] = pc
		}
		_, saturated := p.saturated(e.Load)
		// The counters are read while the engine works or a pace window
		// runs (the snapshot's /metrics answer, or one read), not while it idles.
		c, read := engine.Counters{Load: e.Load}, true
		var at time.Time // when the counters were read, where they were
		if saturated || e.Load.Running+e.Load.Waiting > 0 || !pc.start.at.IsZero() {
			read = false
			if client, found := h.col.Engine(e.CapacityKey); found {
				got, when, err := readCounters(ctx, client, p.readAt)
				c, at, read = got, when, err == nil
			}
		}
		if read { // a failed read leaves both windows as they were (passiveMaxGap)
			// An idle point counts as a read too: a /metrics answer that
			// came before it (another snapshot's, the engine busy then) is
			// read afresh, never added after it, or a window would start
			// before the idle moment and the trackers' time run back.
			now := cmp.Or(at, time.Now())
			p.readAt = now
			p.add(now, c)
			pc.add(now, c, p.ranks)
			if d := stillFor(&p.stillLoad, now, c); d >= cmp.Or(h.staleAfter, probe.StaleLoadAfter) {
				e.Load.StaleSeconds = d.Seconds()
			}
		} else {
			p.stillLoad.Reset() // no proof of stillness
		}
		if pc.latest != nil {
			r := *pc.latest
			e.Pace = &r
		}
		if p.latest != nil {
			r := *p.latest
			e.Passive = &r
		}
	}
}

// readCounters reads client's counters for the passive and pace trackers
// and says when they were read. Within a snapshot (engine.ShareReads) they
// come from the /metrics answer its facts read, which may be well before
// this call: the trackers time them when the answer came, or their
// windows would hold the rest of the snapshot's reads as time the
// counters ran. Two snapshots taken together may read the engine in one
// order and come here in the other: an answer not newer than the last the
// trackers took (last) is read afresh, as counters that went back would
// read as an engine restarted.
func readCounters(ctx context.Context, client *engine.Client, last time.Time) (engine.Counters, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.Counters(ctx)
	at := engine.MetricsReadAt(ctx, client)
	if err == nil && !at.IsZero() && !at.After(last) {
		c, err = client.Counters(engine.FreshReads(ctx))
		at = time.Time{}
	}
	if at.IsZero() {
		at = time.Now()
	}
	return c, at, err
}

// forgetPassive drops the passive and pace trackers of capacity keys no
// snapshot has carried for passiveForget as of now, then the least
// recently seen while more than maxPassiveKeys are kept; never one the
// snapshot of now carried. The caller holds passiveMu.
func (h *Handler) forgetPassive(now time.Time) {
	for k, p := range h.passive {
		if now.Sub(p.seen) > passiveForget {
			delete(h.passive, k)
			delete(h.paces, k)
		}
	}
	for len(h.passive) > maxPassiveKeys {
		oldest := ""
		for k, p := range h.passive {
			if p.seen.Before(now) && (oldest == "" || p.seen.Before(h.passive[oldest].seen)) {
				oldest = k
			}
		}
		if oldest == "" {
			return // every one is in this snapshot
		}
		delete(h.passive, oldest)
		delete(h.paces, oldest)
	}
}
