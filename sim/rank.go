package sim

import (
	"context"
	"slices"
	"sync"
	"time"
)

type seqState int

const (
	stateWaiting seqState = iota
	stateRunning
	stateDone
)

// maxLag is how far a rank may fall behind its schedule (the process was
// descheduled, say) before it gives up catching up and restarts the pace.
const maxLag = time.Second

// seq is one request's sequence on a rank.
type seq struct {
	id      uint64
	tokens  []uint32 // prompt token ids, for the prefix cache; nil = uncacheable
	prompt  int64    // prompt tokens
	reserve int64    // prompt + max tokens: what admission sets aside
	target  int      // tokens this sequence will generate
	finish  string   // finish_reason once target is reached
	wake    chan struct{}
	done    chan struct{} // closed when finished or aborted

	// Guarded by the rank's mu.
	state   seqState
	cached  int64 // prompt tokens the prefix cache served
	todo    int64 // prompt tokens still to prefill
	held    int64 // tokens of the pool this sequence holds
	chain   chainPos
	gen     int
	aborted bool
	// When it was queued and admitted, got its first and its latest token,
	// and finished.
	queued, admitted, first, last, ended time.Time
}

// rank is one data-parallel rank: a continuous-batching loop over its own
// KV pool, FIFO queue and prefix cache.
type rank struct {
	idx        int
	pool       int64
	maxRunning int
	budget     int64 // tokens per step
	mixed      bool  // decode tokens and prompt chunks share a step
	model      stepModel
	// freePrefill: a prompt is whole the moment it is admitted (no
	// --prefill-tps, or the prefill-cached fault).
	freePrefill bool
	accept      int           // tokens per decode step (rankSetup)
	itlPerToken bool          // rankSetup
	cache       *prefixCache  // nil when off
	kick        chan struct{} // wakes an idle loop
	// logEvery, idleLogEvery and stepGauges: rankSetup's.
	logEvery     int
	idleLogEvery time.Duration
	stepGauges   bool

	mu       sync.Mutex
	running  []*seq
	waiting  []*seq
	reserved int64 // sum of reserve over running
	used     int64 // sum of held over running
	stats    rankStats
	// gauges are the load gauges as last written (logEvery > 0), and
	// decodeSteps counts decode steps for the next write.
	gauges      gauges
	decodeSteps int
	// abortedInStep: a request was aborted while a step ran. vLLM takes
	// aborts in between steps and writes no stats for them, so under
	// stepGauges that step leaves the gauges as the one before wrote them.
	abortedInStep bool
}

// gauges are what an SGLang scheduler last wrote to its load gauges, which
// its /metrics and /server_info show. gen throughput is the tokens per
// second between two decode writes, as SGLang logs it.
type gauges struct {
	running, waiting int
	used             int64
	throughput       float64
	at               time.Time // the last write of any kind
	decodeAt         time.Time // the last decode write
	decodeGen        int64     // genTokens then
}

// rankStats are the counters and gauges the metrics endpoints show. Each
// engine counts prompt tokens at its own moment, so there are three.
type rankStats struct {
	requests int64
	// promptFirst adds a prompt when its first token comes (vLLM);
	// promptComputed adds the tokens it really computed, cache hits left
	// out (llama.cpp); promptFinished and cachedFinished add a prompt and
	// its cache hit when the request finishes (SGLang's tokenizer counters).
	promptFirst, promptComputed    int64
	promptFinished, cachedFinished int64
	cacheQueries, cacheHits        int64 // prompt tokens looked up and found
	genTokens                      int64
	finished                       map[string]int64 // by finish reason: stop, length, abort
	steps                          int64
	busySlots                      int64   // sum of sampled sequences over steps
	prefillSeconds                 float64 // time spent on prompts
	maxBatchTok                    int64   // most tokens in one step
	throughput                     float64 // generated tok/s over the last window; 0 when idle
	itl                            itlHist // time between a sequence's tokens
	// genFinished adds a request's tokens when it finishes: SGLang's
	// tokenizer counts generation_tokens_total then, not as they are made.
	genFinished int64
	// ttft is the time from a request's arrival to its first token, one
	// observation per request (SGLang's tokenizer histogram).
	ttft itlHist
	// predicted and predictedSeconds add a request's tokens and the time
	// from its first token to its last when it finishes (llama.cpp's
	// on_prediction; an aborted request adds nothing).
	predicted        int64
	predictedSeconds float64
	winStart         time.Time
	winGen           int64
}

// rankSetup is what every rank of a server shares.
type rankSetup struct {
	// accept is the tokens a decode step gives each running sequence
	// (Config.SpecAccept; 1 without speculative decoding); itlPerToken:
	// the inter-token histogram counts them all against the step's
	// interval (SGLang), not one interval per step (vLLM).
	accept      int
	itlPerToken bool
	maxRunning  int
	budget      int64
	mixed       bool
	model       stepModel
	freePrefill bool
	cacheBlock  int // 0 = no prefix cache
	// logEvery > 0: the load gauges are written as SGLang's scheduler
	// writes them (logGauges), every logEvery decode steps, and while
	// idle every idleLogEvery.
	logEvery     int
	idleLogEvery time.Duration
	// stepGauges: the load gauges are written when a step ends, and only
	// then (Faults.StaleGaugesOnAbort).
	stepGauges bool
}

func newRank(idx int, pool int64, rs rankSetup) *rank {
	r := &rank{
		idx: idx, pool: pool, maxRunning: rs.maxRunning, budget: rs.budget, mixed: rs.mixed,
		model: rs.model, freePrefill: rs.freePrefill, accept: max(1, rs.accept), itlPerToken: rs.itlPerToken,
		kick:     make(chan struct{}, 1),
		logEvery: rs.logEvery, idleLogEvery: rs.idleLogEvery, stepGauges: rs.stepGauges,
		stats: rankStats{finished: map[string]int64{"stop": 0, "length": 0, "abort": 0}, ttft: itlHist{bounds: ttftBuckets}},
	}
	now := time.Now()
	r.gauges.at, r.gauges.decodeAt = now, now
	if rs.cacheBlock > 0 {
		r.cache = newPrefixCache(rs.cacheBlock, pool)
	}
	return r
}

func (r *rank) fits(s *seq) bool {
	return len(r.running) < r.maxRunning && r.reserved+s.reserve <= r.pool
}

// admit starts s: what the prefix cache holds of its prompt is held at
// once, the rest waits for prefill steps.
func (r *rank) admit(s *seq) {
	s.state = stateRunning
	s.admitted = time.Now()
	r.running = append(r.running, s)
	r.reserved += s.reserve
	if r.cache != nil && s.tokens != nil {
		s.cached = r.cache.lookup(s.tokens)
		r.stats.cacheQueries += s.prompt
		r.stats.cacheHits += s.cached
	}
	s.todo = s.prompt - s.cached
	if r.freePrefill {
		s.todo = 0
	}
	r.hold(s, s.prompt-s.todo)
}

// hold adds n computed tokens to s, caching whole blocks of its prompt.
func (r *rank) hold(s *seq, n int64) {
	s.held += n
	r.used += n
	if r.cache != nil && s.tokens != nil {
		r.cache.extend(&s.chain, s.tokens, int(min(s.held, s.prompt)))
	}
}

func (r *rank) admitWaiting() {
	for len(r.waiting) > 0 && r.fits(r.waiting[0]) {
		s := r.waiting[0]
		r.waiting = r.waiting[1:]
		r.admit(s)
	}
}

func (r *rank) release(s *seq) {
	r.reserved -= s.reserve
	r.used -= s.held
}

// enqueue runs s at the next step if it fits and nobody is queued ahead of
// it; otherwise it waits in the FIFO queue. Callers hold mu.
func (r *rank) enqueue(s *seq) {
	r.stats.requests++
	s.queued = time.Now()
	if len(r.waiting) == 0 && r.fits(s) {
		r.admit(s)
	} else {
		r.waiting = append(r.waiting, s)
	}
}

func (r *rank) submit(s *seq) {
	r.mu.Lock()
	r.enqueue(s)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// abort frees s wherever it is (client gone, stream cut, server closing).
func (r *rank) abort(s *seq) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s.state {
	case stateDone:
		return
	case stateWaiting:
		r.waiting = slices.DeleteFunc(r.waiting, func(x *seq) bool { return x == s })
	case stateRunning:
		r.running = slices.DeleteFunc(r.running, func(x *seq) bool { return x == s })
		r.release(s)
	}
	r.abortedInStep = true
	s.state, s.aborted = stateDone, true
	r.stats.finished["abort"]++
	close(s.done)
	r.admitWaiting()
}

// seqProgress is what a request handler reads of its sequence.
type seqProgress struct {
	gen           int
	over, aborted bool
	cached        int64
	admitted      time.Time
	first, ended  time.Time
}

func (r *rank) progress(s *seq) seqProgress {
	r.mu.Lock()
	defer r.mu.Unlock()
	return seqProgress{gen: s.gen, over: s.state == stateDone, aborted: s.aborted, cached: s.cached,
		admitted: s.admitted, first: s.first, ended: s.ended}
}

// step is what one step of a rank does.
type step struct {
	sample  []*seq        // sequences that get a token
	chunks  []promptChunk // prompt chunks prefilled
	prefill int64         // tokens in chunks
}

type promptChunk struct {
	s *seq
	n int64
}

func (st *step) empty() bool { return len(st.sample) == 0 && len(st.chunks) == 0 }

// plan fills st with the next step. Decoding sequences come first, one
// token of the budget each (unless the flavour keeps prompt steps apart and
// a prompt is waiting for its chunks); the rest of the budget goes to
// prompt chunks, oldest sequence first. A sequence whose last prompt chunk
// is in the step samples its first token in it. Callers hold mu.
func (r *rank) plan(st *step) {
	st.sample, st.chunks, st.prefill = st.sample[:0], st.chunks[:0], 0
	left := r.budget
	prefilling := slices.ContainsFunc(r.running, func(s *seq) bool { return s.todo > 0 })
	if r.mixed || !prefilling {
		for _, s := range r.running {
			if s.todo == 0 {
				st.sample = append(st.sample, s)
				left--
			}
		}
	}
	for _, s := range r.running {
		if left <= 0 {
			break
		}
		if s.todo == 0 {
			continue
		}
		n := min(s.todo, left)
		st.chunks = append(st.chunks, promptChunk{s, n})
		st.prefill += n
		left -= n
		if n == s.todo {
			st.sample = append(st.sample, s)
		}
	}
}

// loop paces steps by absolute deadlines from the wall clock, so
// scheduling jitter does not accumulate into a slower rate. An empty rank
// sleeps until submit kicks it.
func (r *rank) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var next time.Time
	var st step
	// starting: the rank has been idle (or has just started) and its next
	// step is the first of a run. It holds even when requests came in
	// before this goroutine first ran, which a busy machine makes likely.
	starting := true
	for {
		r.mu.Lock()
		if len(r.running) == 0 {
			r.stats.throughput, r.stats.winStart = 0, time.Time{}
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-r.kick:
			}
			starting = true
			continue
		}
		if starting {
			r.mu.Unlock()
			starting = false
			next = time.Now()
			// Requests sent together arrive a moment apart: wait a
			// nanosecond, which costs nothing (the step's deadline still
			// counts from the first arrival) but lets them join one step. In
			// a testing/synctest bubble it ends only once every goroutine
			// waits, so a burst sent at one instant always starts together
			// and a test's figures are exact.
			timer.Reset(time.Nanosecond)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		}
		// The step is fixed at its start; arrivals join the next one.
		r.plan(&st)
		r.logGauges(&st)
		decode, prefill := r.stepSeconds(&st)
		r.mu.Unlock()

		if time.Since(next) > maxLag {
			next = time.Now()
		}
		f := r.model.cold(next)
		decode, prefill = decode*f, prefill*f
		next = next.Add(time.Duration((decode + prefill) * float64(time.Second)))
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		r.mu.Lock()
		r.apply(&st, prefill)
		r.mu.Unlock()
	}
}

// logGauges writes the load gauges when a step starts, as SGLang's
// scheduler does (scheduler_metrics_mixin, metrics_reporter): a prefill
// batch writes the requests already decoding, its own not yet among them,
// and the queue; every logEvery-th decode step writes the batch, the
// queue and the decode throughput since the last such write. In between
// the gauges stand still, so they can show requests that have ended or
// miss one that has begun. A step of the sim that gives some sequences
// their first token is SGLang's prefill batch. Callers hold mu.
func (r *rank) logGauges(st *step) {
	if r.logEvery == 0 {
		return
	}
	if len(st.chunks) > 0 || slices.ContainsFunc(st.sample, func(s *seq) bool { return s.gen == 0 }) {
		decoding := 0
		for _, s := range r.running {
			if s.gen > 0 {
				decoding++
			}
		}
		r.gauges.running, r.gauges.waiting, r.gauges.used, r.gauges.at = decoding, len(r.waiting), r.used, time.Now()
		return
	}
	r.decodeSteps++
	if r.decodeSteps%r.logEvery != 0 {
		return
	}
	now := time.Now()
	g := &r.gauges
	if dt := now.Sub(g.decodeAt).Seconds(); dt > 0 {
		g.throughput = float64(r.stats.genTokens-g.decodeGen) / dt
	}
	g.running, g.waiting, g.used, g.at = len(r.running), len(r.waiting), r.used, now
	g.decodeAt, g.decodeGen = now, r.stats.genTokens
}

// stepSeconds is how long a warm step takes: its decode and its prompt
// chunks. A step that gives its sequences k tokens each (speculative
// decoding, seqTokens) takes as long as k plain steps, so the calibration
// stays the tokens delivered. Callers hold mu.
func (r *rank) stepSeconds(st *step) (decode, prefill float64) {
	decode, prefill = r.model.seconds(len(st.sample), st.prefill)
	if r.accept <= 1 || len(st.sample) == 0 {
		return decode, prefill
	}
	n := 0
	for _, s := range st.sample {
		n += r.seqTokens(s)
	}
	return decode * float64(n) / float64(len(st.sample)), prefill
}

// seqTokens is what a step gives s: its first token alone, from its
// prompt's step; then up to accept, never past its target.
func (r *rank) seqTokens(s *seq) int {
	if s.gen == 0 {
		return 1
	}
	return max(1, min(r.accept, s.target-s.gen))
}

// apply ends a step: chunks are computed, and each sampled sequence gains a
// token. Sequences aborted meanwhile are skipped. Callers hold mu.
func (r *rank) apply(st *step, prefill float64) {
	now := time.Now()
	for _, c := range st.chunks {
		if c.s.state != stateRunning {
			continue
		}
		c.s.todo -= c.n
		r.hold(c.s, c.n)
	}
	n := int64(0)
	for _, s := range st.sample {
		if s.state != stateRunning {
			continue
		}
		k := r.seqTokens(s)
		if s.gen > 0 {
			if r.itlPerToken {
				r.stats.itl.observeTokens(now.Sub(s.last), k)
			} else {
				r.stats.itl.observe(now.Sub(s.last))
			}
		}
		s.gen += k
		n += int64(k)
		r.hold(s, int64(k))
		s.last = now
		if s.gen == 1 {
			s.first = now
			r.stats.ttft.observe(now.Sub(s.queued))
			r.stats.promptFirst += s.prompt
			r.stats.promptComputed += s.prompt - s.cached
		}
		if s.gen >= s.target {
			s.state, s.ended = stateDone, now
			r.stats.finished[s.finish]++
			r.stats.promptFinished += s.prompt
			r.stats.cachedFinished += s.cached
			r.stats.genFinished += int64(s.gen)
			r.stats.predicted += int64(s.gen)
			r.stats.predictedSeconds += s.last.Sub(s.first).Seconds()
			r.release(s)
			close(s.done)
			continue
		}
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	r.running = slices.DeleteFunc(r.running, func(x *seq) bool { return x.state != stateRunning })
	r.admitWaiting()
	if r.stepGauges && !r.abortedInStep {
		r.gauges.running, r.gauges.waiting, r.gauges.used, r.gauges.at = len(r.running), len(r.waiting), r.used, now
	}
	r.abortedInStep = false

	sts := &r.stats
	sts.genTokens += n
	sts.steps++
	sts.busySlots += int64(len(st.sample))
	sts.maxBatchTok = max(sts.maxBatchTok, n+st.prefill)
	sts.prefillSeconds += prefill
	switch {
	case sts.winStart.IsZero():
		sts.winStart, sts.winGen = now, sts.genTokens-n
	case now.Sub(sts.winStart) >= 500*time.Millisecond:
		sts.throughput = float64(sts.genTokens-sts.winGen) / now.Sub(sts.winStart).Seconds()
		sts.winStart, sts.winGen = now, sts.genTokens
	}
}

// rankView is a consistent snapshot of a rank for the status endpoints.
type rankView struct {
	idx      int
	pool     int64
	running  int
	waiting  int
	used     int64
	pending  int64 // prompt tokens still to prefill, running and waiting
	stats    rankStats
	seqs     []seqView // running, in admission order
	maxSlots int
	// gauges are the load gauges as the metrics show them: their last
	// write (SGLang; vLLM with Faults.StaleGaugesOnAbort), else running,
	// waiting and used as they are.
	gauges gauges
}

type seqView struct {
	id     uint64
	gen    int
	target int
	prompt int64
}

func (r *rank) view() rankView {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := rankView{
		idx: r.idx, pool: r.pool, running: len(r.running), waiting: len(r.waiting),
		used: r.used, stats: r.stats, maxSlots: r.maxRunning,
	}
	switch now := time.Now(); {
	case r.logEvery == 0 && !r.stepGauges:
		v.gauges = gauges{running: v.running, waiting: v.waiting, used: v.used, throughput: r.stats.throughput, at: now}
	case r.logEvery > 0 && v.running+v.waiting == 0 && now.Sub(r.gauges.at) > r.idleLogEvery:
		// SGLang's idle loop writes them once the interval has passed:
		// whenever that was, a reader sees them written by now.
		r.gauges.running, r.gauges.waiting, r.gauges.used, r.gauges.throughput, r.gauges.at = 0, 0, r.used, 0, now
		fallthrough
	default:
		v.gauges = r.gauges
	}
	v.stats.itl = r.stats.itl.clone()
	v.stats.ttft = r.stats.ttft.clone()
	v.stats.finished = make(map[string]int64, len(r.stats.finished))
	for k, n := range r.stats.finished {
		v.stats.finished[k] = n
	}
	for _, s := range r.running {
		v.seqs = append(v.seqs, seqView{id: s.id, gen: s.gen, target: s.target, prompt: s.prompt})
		v.pending += s.todo
	}
	for _, s := range r.waiting {
		v.pending += s.prompt
	}
	return v
}
