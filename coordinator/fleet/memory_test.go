package fleet

import (
	"math"
	"strings"
	"testing"
	"time"

	"heft/shared/wire"
)

const gibibyte = 1 << 30

// An Ollama-like engine measured with 20 GiB on its GPU lets its model
// go when idle, and another process takes 16 GiB of the GPU meanwhile:
// the memory its burst ran in is no longer there for it. Once that lasts
// MemoryShortSustained the worker is measured again, the cause named,
// once per spell; a short spell, or a shortfall within the margin, is
// nothing.
func TestMemoryShortRemeasures(t *testing.T) {
	h := newHarness(t)
	other := func(used uint64) wire.GPUProcess {
		return wire.GPUProcess{PID: 900, Name: "other-team", UsedMemory: used, Foreign: true}
	}
	set := func(engineHolds, otherHolds uint64) {
		procs := []wire.GPUProcess{other(otherHolds)}
		e := engine("k", "http://1:11434", "m")
		e.PID = 42
		if engineHolds > 0 {
			procs = append(procs, wire.GPUProcess{PID: 43, Name: "ollama", UsedMemory: engineHolds})
			e.GPUUUIDs = []string{"GPU-a"}
			e.GPUMemory = []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: engineHolds}}
		}
		h.gpus["n"] = []wire.GPU{{Index: 0, UUID: "GPU-a", MemoryTotal: 24 * gibibyte,
			MemoryUsed: engineHolds + otherHolds, MemoryFree: 24*gibibyte - engineHolds - otherHolds, Processes: procs}}
		h.engines["n"] = []wire.Engine{e}
	}
	step := func(d time.Duration) []*wire.ProbeRequest {
		h.clk.advance(d)
		return requests(h.snapshot("n"), "k")
	}

	set(20*gibibyte, gibibyte)
	h.connectOnce("n")
	h.snapshot("n")
	m := measured("k", 1800, h.clk.now())
	m.GPUMemory = []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: 20 * gibibyte}}
	h.result("n", m)

	// The model unloaded, the GPU free: it would load as measured.
	set(0, gibibyte)
	if r := step(5 * time.Minute); len(r) != 0 {
		t.Fatalf("an unloaded engine with room was measured again: %+v", r)
	}
	// Another process takes 16 GiB for 40 s, then lets it go: too short.
	set(0, 17*gibibyte)
	step(time.Second)
	if r := step(40 * time.Second); len(r) != 0 {
		t.Fatalf("a 40 s spell: %+v", r)
	}
	set(0, gibibyte)
	step(time.Second)
	// A shortfall within the margin (19.5 GiB of room against 20): nothing.
	set(0, 4.5*gibibyte)
	if r := step(2 * time.Minute); len(r) != 0 {
		t.Fatalf("half a GiB short re-measured: %+v", r)
	}
	// Short by 14 GiB for over a minute: one request, named.
	set(0, 17*gibibyte)
	step(time.Second)
	step(30 * time.Second)
	r := step(31 * time.Second)
	want := "memory_short: GPU 0 has 7.0 GiB free and the engine holds 0.0 GiB there; it held 20.0 GiB in its measured burst for 1m1s"
	if len(r) != 1 || r[0].Cause != want {
		t.Fatalf("after 61 s short: %+v, want one request with cause %q", r, want)
	}
	// The engine is measured in what it has now: 7 GiB on the GPU, the
	// rest of the model on the CPU, a fraction of the throughput.
	set(7*gibibyte, 17*gibibyte)
	h.result("n", answerHolding(r[0], 450, h.clk.now(), "GPU-a", 7*gibibyte))
	if r := step(5 * time.Minute); len(r) != 0 {
		t.Fatalf("measured again after a measurement in what it has: %+v", r)
	}
	if got := h.worker("k").Throughput; got == nil || *got != 450 {
		t.Errorf("throughput %v, want the new measurement's 450", got)
	}
}

// A spell in which the worker was measured asks no more while it lasts,
// and a new spell asks again.
func TestMemoryShortOncePerSpell(t *testing.T) {
	h := newHarness(t)
	short := func(yes bool) {
		other := uint64(gibibyte)
		if yes {
			other = 20 * gibibyte
		}
		h.gpus["n"] = []wire.GPU{{Index: 1, UUID: "GPU-b", MemoryTotal: 24 * gibibyte, MemoryFree: 24*gibibyte - other,
			Processes: []wire.GPUProcess{{PID: 900, UsedMemory: other}}}}
	}
	e := engine("k", "http://1:8000", "m")
	e.PID = 42
	short(false)
	h.engines["n"] = []wire.Engine{e}
	h.connectOnce("n")
	h.snapshot("n")
	m := measured("k", 1800, h.clk.now())
	m.GPUMemory = []wire.GPUMemory{{UUID: "GPU-b", UsedBytes: 10 * gibibyte}}
	h.result("n", m)
	step := func(d time.Duration) []*wire.ProbeRequest {
		h.clk.advance(d)
		return requests(h.snapshot("n"), "k")
	}
	short(true)
	step(time.Second)
	r0 := step(time.Minute)
	if len(r0) != 1 || !strings.HasPrefix(r0[0].Cause, "memory_short: GPU 1 has 4.0 GiB free") {
		t.Fatalf("first spell: %+v", r0)
	}
	// Measured in the spell (the other process paused while the engine
	// loaded again): the spell asks no more, however long it lasts.
	h.result("n", answerHolding(r0[0], 1780, h.clk.now(), "GPU-b", 10*gibibyte))
	if r := step(10 * time.Minute); len(r) != 0 {
		t.Fatalf("a spell in which the worker was measured asked again: %+v", r)
	}
	short(false)
	step(time.Second)
	short(true)
	step(time.Second)
	if r := step(time.Minute); len(r) != 1 {
		t.Fatalf("a second spell: %+v", r)
	}
}

// answerHolding is the measurement that answers r: tps, with the engine
// holding held on GPU uuid in its burst.
func answerHolding(r *wire.ProbeRequest, tps float64, at time.Time, uuid string, held uint64) wire.Measurement {
	m := measured(r.CapacityKey, tps, at)
	m.Trigger, m.Cause = r.Reason, r.Cause
	m.GPUMemory = []wire.GPUMemory{{UUID: uuid, UsedBytes: held}}
	return m
}

func TestMemoryShort(t *testing.T) {
	m := &wire.Measurement{GPUMemory: []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: 20 * gibibyte}}}
	eng := func(pid int, holds uint64) wire.Engine {
		e := wire.Engine{PID: pid}
		if holds > 0 {
			e.GPUMemory = []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: holds}}
		}
		return e
	}
	gpu := func(free uint64, procs int) []wire.GPU {
		g := wire.GPU{UUID: "GPU-a", MemoryTotal: 24 * gibibyte, MemoryFree: free}
		for i := range procs {
			g.Processes = append(g.Processes, wire.GPUProcess{PID: 900 + i, UsedMemory: gibibyte})
		}
		return []wire.GPU{g}
	}
	for _, tt := range []struct {
		name  string
		e     wire.Engine
		gpus  []wire.GPU
		short bool
	}{
		{"the pool still held", eng(42, 20*gibibyte), gpu(gibibyte, 2), false},
		{"let go, room to load again", eng(42, 0), gpu(22*gibibyte, 1), false},
		{"let go, no room", eng(42, 0), gpu(6*gibibyte, 1), true},
		{"part held, the rest not free", eng(42, 10*gibibyte), gpu(2*gibibyte, 2), true},
		{"short by the margin exactly", eng(42, 10*gibibyte), gpu(9*gibibyte, 2), false},
		{"short by more than the margin", eng(42, 10*gibibyte), gpu(9*gibibyte-1, 2), true},
		{"processes not visible", eng(42, 0), gpu(gibibyte, 0), false},
		{"the engine's process unknown", eng(0, 0), gpu(gibibyte, 1), false},
		{"the GPU gone", eng(42, 0), []wire.GPU{{UUID: "GPU-z", MemoryFree: gibibyte, Processes: []wire.GPUProcess{{PID: 1}}}}, false},
		{"the GPU unreadable", eng(42, 0), []wire.GPU{{UUID: "GPU-a", Error: "lost", Processes: []wire.GPUProcess{{PID: 1}}}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			why := memoryShort(m, tt.e, tt.gpus)
			if (why != "") != tt.short {
				t.Errorf("memoryShort = %q, want short %v", why, tt.short)
			}
		})
	}
	if why := memoryShort(&wire.Measurement{}, eng(42, 0), gpu(0, 1)); why != "" {
		t.Errorf("a measurement that recorded no memory: %q", why)
	}
}

// What an engine holds plus what is free saturates: numbers near 2^64
// (no GPU has them, but the wire lets any uint64 through) never wrap
// round to a small room that reads as short, nor a burst that held
// everything to one that fits.
func TestMemoryShortExtremeValues(t *testing.T) {
	const most = math.MaxUint64
	gpu := func(free uint64) []wire.GPU {
		return []wire.GPU{{UUID: "GPU-a", MemoryTotal: 24 * gibibyte, MemoryFree: free, Processes: []wire.GPUProcess{{PID: 900}}}}
	}
	holding := func(b uint64) []wire.GPUMemory { return []wire.GPUMemory{{UUID: "GPU-a", UsedBytes: b}} }
	for _, tt := range []struct {
		name         string
		burst, holds uint64
		free         uint64
		short        bool
	}{
		{"the engine holds 2^64-1", 20 * gibibyte, most, 2 * gibibyte, false},
		{"2^64-1 free", 20 * gibibyte, 10 * gibibyte, most, false},
		{"both halves of 2^64", 20 * gibibyte, 1 << 63, 1 << 63, false},
		{"both at 2^64-1", 20 * gibibyte, most, most, false},
		{"a burst of 2^64-1, all of it there", most, most - 4*gibibyte, 4 * gibibyte, false},
		{"a burst of 2^64-1, a little there", most, 4 * gibibyte, 4 * gibibyte, true},
		{"a burst of 2^64-1, its sum past 2^64", most, most, 1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &wire.Measurement{GPUMemory: holding(tt.burst)}
			e := wire.Engine{PID: 42, GPUMemory: holding(tt.holds)}
			why := memoryShort(m, e, gpu(tt.free))
			if (why != "") != tt.short {
				t.Errorf("memoryShort = %q, want short %v", why, tt.short)
			}
		})
	}
}
