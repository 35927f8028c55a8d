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
	prompt  int64
	reserve int64  // prompt + max tokens: what admission sets aside
	target  int    // tokens this sequence will generate
	finish  string // finish_reason once target is reached
	wake    chan struct{}
	done    chan struct{} // closed when finished or aborted

	// Guarded by the rank's mu.
	state   seqState
	gen     int
	aborted bool
}

// rank is one data-parallel rank: a continuous-batching loop over its own
// KV pool and FIFO queue.
type rank struct {
	idx        int
	pool       int64
	maxRunning int
	model      stepModel
	kick       chan struct{} // wakes an idle loop

	mu       sync.Mutex
	running  []*seq
	waiting  []*seq
	reserved int64 // sum of reserve over running
	used     int64 // prompt + generated tokens over running
	stats    rankStats
}

// rankStats are the counters and gauges the metrics endpoints show.
type rankStats struct {
	requests     int64
	promptTokens int64
	genTokens    int64
	finished     map[string]int64 // by finish reason: stop, length, abort
	steps        int64
	busySlots    int64   // sum of batch sizes over steps
	stepSeconds  float64 // decode time spent
	maxBatchTok  int64
	throughput   float64 // tok/s over the last window; 0 when idle
	winStart     time.Time
	winGen       int64
}

func newRank(idx int, pool int64, maxRunning int, m stepModel) *rank {
	return &rank{
		idx: idx, pool: pool, maxRunning: maxRunning, model: m,
		kick:  make(chan struct{}, 1),
		stats: rankStats{finished: map[string]int64{"stop": 0, "length": 0, "abort": 0}},
	}
}

func (r *rank) fits(s *seq) bool {
	return len(r.running) < r.maxRunning && r.reserved+s.reserve <= r.pool
}

func (r *rank) admit(s *seq) {
	s.state = stateRunning
	r.running = append(r.running, s)
	r.reserved += s.reserve
	r.used += s.prompt
	r.stats.promptTokens += s.prompt
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
	r.used -= s.prompt + int64(s.gen)
}

// submit runs s at the next step if it fits and nobody is queued ahead of
// it; otherwise it waits in the FIFO queue.
func (r *rank) submit(s *seq) {
	r.mu.Lock()
	r.stats.requests++
	if len(r.waiting) == 0 && r.fits(s) {
		r.admit(s)
	} else {
		r.waiting = append(r.waiting, s)
	}
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
	s.state, s.aborted = stateDone, true
	r.stats.finished["abort"]++
	close(s.done)
	r.admitWaiting()
}

// progress reports how many tokens s has and whether it is over.
func (r *rank) progress(s *seq) (gen int, over, aborted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return s.gen, s.state == stateDone, s.aborted
}

// loop paces decode steps by absolute deadlines from the wall clock, so
// scheduling jitter does not accumulate into a slower rate. An empty
// batch sleeps until submit kicks it.
func (r *rank) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var next time.Time
	var batch []*seq
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
			next = time.Now()
			continue
		}
		// The batch is fixed at the step's start; arrivals join the next one.
		batch = append(batch[:0], r.running...)
		r.mu.Unlock()

		if time.Since(next) > maxLag {
			next = time.Now()
		}
		d := r.model.duration(len(batch), next)
		next = next.Add(d)
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		r.finishStep(batch, d)
	}
}

// finishStep gives every sequence of the batch one token.
func (r *rank) finishStep(batch []*seq, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(0)
	for _, s := range batch {
		if s.state != stateRunning {
			continue // aborted during the step
		}
		s.gen++
		n++
		r.used++
		if s.gen >= s.target {
			s.state = stateDone
			r.stats.finished[s.finish]++
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

	st := &r.stats
	st.genTokens += n
	st.steps++
	st.busySlots += int64(len(batch))
	st.maxBatchTok = max(st.maxBatchTok, n)
	st.stepSeconds += d.Seconds()
	now := time.Now()
	switch {
	case st.winStart.IsZero():
		st.winStart, st.winGen = now, st.genTokens-n
	case now.Sub(st.winStart) >= 500*time.Millisecond:
		st.throughput = float64(st.genTokens-st.winGen) / now.Sub(st.winStart).Seconds()
		st.winStart, st.winGen = now, st.genTokens
	}
}

// rankView is a consistent snapshot of a rank for the status endpoints.
type rankView struct {
	idx      int
	pool     int64
	running  int
	waiting  int
	used     int64
	stats    rankStats
	seqs     []seqView // running, in admission order
	maxSlots int
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
	v.stats.finished = make(map[string]int64, len(r.stats.finished))
	for k, n := range r.stats.finished {
		v.stats.finished[k] = n
	}
	for _, s := range r.running {
		v.seqs = append(v.seqs, seqView{id: s.id, gen: s.gen, target: s.target, prompt: s.prompt})
	}
	return v
}
