package agent

import (
	"slices"
	"strings"
	"time"

	"heft/shared/wire"
)

// The agent keeps the fresh measurement a coordinator hands it for each
// of its engines (wire.CachedMeasurement: on each connection, and after
// each valid result) and offers them in its next hello. A coordinator
// that restarted on an empty state takes them (after its own checks)
// instead of sending a registration burst onto engines the gateways still
// route users to. Memory only: an agent that restarts has nothing to
// offer, and its coordinator, which still has its state, hands it back.

// held is one kept measurement and the engine it was taken on.
type held struct {
	m    wire.CachedMeasurement
	pid  int      // the engine's process when it was handed over; 0 when unknown
	gpus []string // and its GPUs
}

// Cached keeps the coordinator's fresh measurement of one of this node's
// engines, to offer it to a coordinator that has lost it.
func (h *Handler) Cached(m wire.CachedMeasurement) {
	key := m.Measurement.CapacityKey
	h.log.Info("coordinator holds a fresh measurement", "capacity_key", key,
		"throughput_tps", m.Measurement.ThroughputTPS, "expires_at", m.ExpiresAt)
	if !m.Measurement.Valid() || m.Measurement.Implausible != "" || !m.ExpiresAt.After(time.Now()) {
		return // a coordinator would refuse it
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := engineByKey(h.last, key)
	if !ok {
		return // not one of the engines listed now
	}
	if h.held == nil {
		h.held = map[string]held{}
	}
	for k := range h.held {
		if _, listed := engineByKey(h.last, k); !listed {
			delete(h.held, k) // bounded by the engines listed now
		}
	}
	h.held[key] = held{m: m, pid: e.PID, gpus: slices.Clone(e.GPUUUIDs)}
}

// Held returns what the next hello offers: a kept measurement for each
// engine listed in the newest snapshot, not expired, whose engine is the
// process and the GPUs it was measured on. The rest are forgotten.
func (h *Handler) Held() []wire.CachedMeasurement {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	var out []wire.CachedMeasurement
	for key, x := range h.held {
		e, ok := engineByKey(h.last, key)
		if !ok || !x.m.ExpiresAt.After(now) || (x.pid > 0 && e.PID > 0 && x.pid != e.PID) ||
			(len(x.gpus) > 0 && len(e.GPUUUIDs) > 0 && !sameSet(x.gpus, e.GPUUUIDs)) {
			delete(h.held, key) // the engine changed or left: its number no longer holds
			continue
		}
		out = append(out, x.m)
	}
	slices.SortFunc(out, func(a, b wire.CachedMeasurement) int {
		return strings.Compare(a.Measurement.CapacityKey, b.Measurement.CapacityKey)
	})
	if len(out) > wire.MaxEngines {
		out = out[:wire.MaxEngines]
	}
	return out
}

func engineByKey(s wire.Snapshot, key string) (wire.Engine, bool) {
	for _, e := range s.Engines {
		if key != "" && e.CapacityKey == key {
			return e, true
		}
	}
	return wire.Engine{}, false
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
