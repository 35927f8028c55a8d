package agent

import (
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

// The agent offers a kept measurement only while it holds: not expired,
// its engine still listed, the same process on the same GPUs.
func TestHeldMeasurements(t *testing.T) {
	h := &Handler{log: hclog.NewNullLogger()}
	eng := func(key string, pid int, gpus ...string) wire.Engine {
		return wire.Engine{Kind: wire.EngineVLLM, URL: "http://127.0.0.1:8000", CapacityKey: key, PID: pid, GPUUUIDs: gpus}
	}
	cm := func(key string, tps float64, expires time.Time) wire.CachedMeasurement {
		return wire.CachedMeasurement{Measurement: wire.Measurement{CapacityKey: key, ThroughputTPS: tps, OutputTokens: 100}, ExpiresAt: expires}
	}
	later := time.Now().Add(time.Hour)
	h.last = wire.Snapshot{Engines: []wire.Engine{eng("a", 10, "GPU-1"), eng("b", 20), eng("c", 30), eng("d", 40)}}
	h.Cached(cm("a", 1000, later))
	h.Cached(cm("b", 0, later))                        // not valid: never offered
	h.Cached(cm("c", 900, time.Now().Add(-time.Hour))) // expired
	h.Cached(cm("d", 800, later))
	h.Cached(cm("x", 700, later)) // no such engine
	offers := func() []string {
		var keys []string
		for _, o := range h.Held() {
			keys = append(keys, o.Measurement.CapacityKey)
		}
		return keys
	}
	if got := offers(); len(got) != 2 || got[0] != "a" || got[1] != "d" {
		t.Fatalf("offers %v, want [a d]", got)
	}
	// a's engine restarted (another pid); d's left the node.
	h.last = wire.Snapshot{Engines: []wire.Engine{eng("a", 11, "GPU-1")}}
	if got := offers(); len(got) != 0 {
		t.Fatalf("offers %v after the engines changed, want none", got)
	}
	// a measured again on its new process, then moved to other GPUs.
	h.Cached(cm("a", 1000, later))
	if got := offers(); len(got) != 1 {
		t.Fatalf("offers %v, want [a]", got)
	}
	h.last = wire.Snapshot{Engines: []wire.Engine{eng("a", 11, "GPU-2")}}
	if got := offers(); len(got) != 0 {
		t.Fatalf("offers %v after the GPUs changed, want none", got)
	}
}
