package probe

import (
	"context"
	"slices"
	"sync"
	"time"

	"heft/shared/wire"
)

// gpuSampleEvery is how often SM clocks are read during the measured burst.
const gpuSampleEvery = 200 * time.Millisecond

// gpuSummary is what the clocks did during the measured burst.
type gpuSummary struct {
	Samples           int
	Idle              int // samples of GPUs that reported themselves idle, left out
	MinMHz, MedianMHz float64
	MaxMHz            float64
	Reasons           []string
	Err               error // the last read error, if no sample succeeded
	// Memory is the most the engine's processes held on each of its
	// GPUs in any sample, in the order the GPUs were first seen.
	Memory []wire.GPUMemory
}

// gpuSampler reads the engine's GPUs on a ticker until stopped.
type gpuSampler struct {
	mu      sync.Mutex
	clocks  []float64
	maxMHz  float64
	reasons map[string]bool
	reads   int
	idle    int // samples skipped because the GPU reported itself idle
	lastErr error
	// tree holds the engine's processes; memory the most they held on
	// each GPU.
	tree   map[int]bool
	memory []wire.GPUMemory

	cancel context.CancelFunc
	done   chan struct{}
}

// startGPUSampler samples at once and then every gpuSampleEvery, so even
// a burst shorter than the interval has a sample. uuids selects the
// engine's GPUs for the clocks; empty means all. tree lists the engine's
// processes, whose memory is followed on every GPU they hold any on.
func startGPUSampler(ctx context.Context, read func(context.Context) ([]wire.GPU, error), uuids []string, tree []int) *gpuSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &gpuSampler{reasons: map[string]bool{}, cancel: cancel, done: make(chan struct{}), tree: map[int]bool{}}
	for _, pid := range tree {
		s.tree[pid] = true
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(gpuSampleEvery)
		defer t.Stop()
		for {
			s.sample(ctx, read, uuids)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *gpuSampler) sample(ctx context.Context, read func(context.Context) ([]wire.GPU, error), uuids []string) {
	gpus, err := read(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			s.lastErr = err
		}
		return
	}
	for _, g := range gpus {
		if g.Error == "" {
			s.noteMemory(g)
		}
		if g.Error != "" || (len(uuids) > 0 && !slices.Contains(uuids, g.UUID)) {
			continue
		}
		// An idle GPU clocks down by design: its clock says nothing about
		// how fast it runs this engine, and on a host whose engine GPUs are
		// unknown (uuids empty) it is most likely not the engine's at all.
		if slices.Contains(g.ClockEventReasons, "gpu_idle") {
			s.idle++
			s.maxMHz = max(s.maxMHz, float64(g.SMClockMaxMHz))
			continue
		}
		if g.SMClockMHz > 0 {
			s.clocks = append(s.clocks, float64(g.SMClockMHz))
			s.reads++
		}
		s.maxMHz = max(s.maxMHz, float64(g.SMClockMaxMHz))
		for _, r := range g.ClockEventReasons {
			if r != "" {
				s.reasons[r] = true
			}
		}
	}
}

// noteMemory keeps the most the engine's processes held on g (s.mu held),
// on a GPU that lists one of them.
func (s *gpuSampler) noteMemory(g wire.GPU) {
	var held uint64
	listed := false
	for _, p := range g.Processes {
		if s.tree[p.PID] {
			held += p.UsedMemory
			listed = true
		}
	}
	if !listed || g.UUID == "" {
		return
	}
	i := slices.IndexFunc(s.memory, func(m wire.GPUMemory) bool { return m.UUID == g.UUID })
	switch {
	case i >= 0:
		s.memory[i].UsedBytes = max(s.memory[i].UsedBytes, held)
	case len(s.memory) < wire.MaxListItems:
		s.memory = append(s.memory, wire.GPUMemory{UUID: g.UUID, UsedBytes: held})
	}
}

// stop ends sampling and summarises. It waits briefly for a read in
// progress; a GPU source that ignores its context cannot hold the probe.
func (s *gpuSampler) stop() gpuSummary {
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(2 * time.Second):
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := gpuSummary{Samples: s.reads, Idle: s.idle, MaxMHz: s.maxMHz, Memory: slices.Clone(s.memory)}
	if len(s.clocks) > 0 {
		sum.MinMHz = slices.Min(s.clocks)
		sum.MedianMHz = median(s.clocks)
	} else {
		sum.Err = s.lastErr
	}
	for r := range s.reasons {
		sum.Reasons = append(sum.Reasons, r)
	}
	slices.Sort(sum.Reasons)
	return sum
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
