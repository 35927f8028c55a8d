package fleet

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"heft/shared/wire"
)

// An engine's measurement holds only while the memory its burst ran in is
// still there for it. A pool allocated at start (vLLM, SGLang, llama.cpp)
// stays held, but an engine that lets memory go and takes it again on
// demand (Ollama unloads an idle model; an engine put to sleep) gets
// less when another process took the GPU meanwhile: Ollama then loads
// part of the model on the CPU, and serves a fraction of what it was
// measured at.
//
// So each measurement records the most the engine's processes held on
// each GPU during its measured burst (Measurement.GPUMemory), and each
// snapshot what they hold now (Engine.GPUMemory). When, on one of those
// GPUs, what the engine holds plus what is free falls short of what the
// burst held by more than memoryShortMargin, for MemoryShortSustained,
// the worker is measured again, cause CauseMemoryShort, as probe_busy
// allows; once per spell, and not when measured within it.
const (
	CauseMemoryShort     = "memory_short"
	MemoryShortSustained = time.Minute
)

// memoryShortMargin is the shortfall that counts: a twentieth of what the
// burst held, at least 512 MiB, so an allocator's wobble is none.
func memoryShortMargin(burst uint64) uint64 {
	return max(burst/20, 512<<20)
}

// memoryShort names the first GPU on which the memory m's burst held no
// longer fits in what e's processes hold there now plus what is free, or
// "". GPUs that cannot be read, or that list no process at all (per-process
// memory not visible, as in some containers), are not judged, and
// neither is an engine whose processes the agent does not know (pid 0).
func memoryShort(m *wire.Measurement, e wire.Engine, gpus []wire.GPU) string {
	if e.PID <= 0 {
		return ""
	}
	for _, burst := range m.GPUMemory {
		i := slices.IndexFunc(gpus, func(g wire.GPU) bool { return g.UUID == burst.UUID })
		if i < 0 {
			continue
		}
		g := gpus[i]
		if g.Error != "" || len(g.Processes) == 0 {
			continue
		}
		var now uint64
		for _, h := range e.GPUMemory {
			if h.UUID == burst.UUID {
				now = h.UsedBytes
			}
		}
		room, carry := bits.Add64(now, g.MemoryFree, 0)
		if carry != 0 {
			room = math.MaxUint64 // past 2^64 is room enough; wrapped, it read as short
		}
		if room >= burst.UsedBytes || burst.UsedBytes-room <= memoryShortMargin(burst.UsedBytes) {
			continue
		}
		return fmt.Sprintf("%s: GPU %d has %s free and the engine holds %s there; it held %s in its measured burst",
			CauseMemoryShort, g.Index, gib(g.MemoryFree), gib(now), gib(burst.UsedBytes))
	}
	return ""
}

func gib(b uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// noteMemory follows how long the memory w's measured burst held has been
// short on its GPUs (gpus: the host's, since an engine that let its memory
// go is listed on none) and marks w for a re-measurement once that lasted
// MemoryShortSustained, once per spell.
func (f *Fleet) noteMemory(w *worker, gpus []wire.GPU, now time.Time) {
	m := f.newest(w.id)
	why := ""
	if m != nil && m.Valid() && !w.placeholder {
		why = memoryShort(m, w.eng, gpus)
	}
	if why == "" {
		w.memoryShortSince, w.memoryShortAsked = time.Time{}, false
		return
	}
	if w.memoryShortSince.IsZero() {
		w.memoryShortSince = now
		f.log.Info("the memory the engine's measured burst ran in is no longer there for it; measuring it again if this lasts",
			"worker", w.id, "why", why, "lasts_at_least", MemoryShortSustained.String())
	}
	lasted := now.Sub(w.memoryShortSince)
	if w.memoryShortAsked || lasted < MemoryShortSustained {
		return
	}
	w.memoryShortAsked = true
	if m.FinishedAt.After(w.memoryShortSince) {
		return // measured in this spell already
	}
	cause := fmt.Sprintf("%s for %s", why, lasted.Round(time.Second))
	if w.remeasure == "" {
		f.log.Info("the engine's memory has been short since its measurement; measuring it again", "worker", w.id, "cause", cause)
		w.remeasure = cause
	}
}
