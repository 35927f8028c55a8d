package fleet

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"heft/shared/wire"
)

// Every number an agent sends, set in turn to an extreme the wire
// decoder lets through (the smallest positive float, the largest, the
// largest integers), is either refused on receipt or leaves the fleet
// able to answer: its views and weight tables marshal (no NaN or Inf),
// and every weight is a finite number above zero.
func TestExtremeNumbersKeepTheFleetAnswering(t *testing.T) {
	h := newHarness(t)
	h.admit("a", engine("ka", "http://10.0.0.1:8000", "m", 9000), 1000)
	h.admit("b", engine("kb", "http://10.0.0.2:8000", "m", 9000), 460)
	h.connect("evil")
	h.f.Snapshot("evil", hostileBaseline(h.clk.now()))
	h.result("evil", measured("ke", 800, h.clk.now()))
	accepted, refused := 0, 0
	for _, path := range numberPaths(reflect.TypeFor[wire.Snapshot](), "") {
		for _, v := range []float64{5e-324, 1e-300, 1e308, math.MaxFloat64} {
			s := hostileBaseline(h.clk.now())
			if !setNumber(reflect.ValueOf(&s).Elem(), path, v) {
				continue
			}
			data, err := wire.Encode(&s)
			if err != nil {
				refused++
				continue
			}
			env, err := wire.Decode(data)
			if err != nil {
				refused++
				continue
			}
			accepted++
			h.clk.advance(10 * time.Second)
			h.f.Snapshot("evil", *env.Snapshot)
			h.f.Tick()
			checkAnswering(t, h, fmt.Sprintf("snapshot %s = %g", path, v))
		}
	}
	for _, path := range numberPaths(reflect.TypeFor[wire.Measurement](), "") {
		for _, v := range []float64{5e-324, 1e-300, 1e308, math.MaxFloat64} {
			m := measured("ke", 800, h.clk.now())
			m.DecodeTPSP50, m.SMClockMedianMHz, m.SMClockMaxMHz, m.SMClockMinMHz = 40, 1800, 1900, 1700
			m.Prefill = &wire.Prefill{ThroughputTPS: 9000, WarmupTPS: 8000, PromptTokens: 16384, ExpectedPromptTokens: 16384,
				WallSeconds: 1.8, PromptLength: 1024, Requests: 16, Concurrency: 16, TTFTP50: 0.5, TTFTP95: 0.9}
			if !setNumber(reflect.ValueOf(&m).Elem(), path, v) {
				continue
			}
			if _, err := h.f.Probe("ke"); err != nil || h.requestID("ke") == "" {
				t.Fatalf("no probe of ke for %s: %v", path, err)
			}
			pr := wire.ProbeResult{RequestID: h.requestID("ke"), Measurement: m}
			data, err := wire.Encode(&pr)
			if err == nil {
				_, err = wire.Decode(data)
			}
			if err != nil {
				refused++
				continue
			}
			accepted++
			_, _ = h.f.ProbeResult("evil", pr) // refused or taken: either way the fleet must answer
			h.clk.advance(10 * time.Second)
			h.f.Snapshot("evil", hostileBaseline(h.clk.now()))
			h.f.Tick()
			checkAnswering(t, h, fmt.Sprintf("measurement %s = %g", path, v))
		}
	}
	t.Logf("%d extreme numbers accepted, %d refused on receipt", accepted, refused)
}

// checkAnswering fails the test when a view or weight table of the fleet
// does not marshal or carries a weight that is not finite and positive.
func checkAnswering(t *testing.T, h *harness, what string) {
	t.Helper()
	if _, err := json.Marshal(h.f.Workers()); err != nil {
		t.Fatalf("%s: the workers' view does not marshal: %v", what, err)
	}
	for _, kind := range []string{"decode", "prefill"} {
		wt, ok, err := h.f.WeightsOf("m", kind)
		if !ok || err != nil {
			t.Fatalf("%s: no %s table of m: %v", what, kind, err)
		}
		if _, err := json.Marshal(wt); err != nil {
			t.Fatalf("%s: the %s table does not marshal: %v", what, kind, err)
		}
		for _, e := range wt.Workers {
			if math.IsNaN(e.Weight) || math.IsInf(e.Weight, 0) || e.Weight <= 0 {
				t.Fatalf("%s: %s weight of %s is %v", what, kind, e.ID, e.Weight)
			}
		}
	}
	if _, err := json.Marshal(h.f.Since(0)); err != nil {
		t.Fatalf("%s: the change stream does not marshal: %v", what, err)
	}
}

// hostileBaseline is evil's snapshot with every number given: one GPU,
// one engine with two ranks, load, pace and a passive reading.
func hostileBaseline(at time.Time) wire.Snapshot {
	e := engine("ke", "http://10.0.0.3:8000", "m", 9000, 8800)
	e.MaxRunning, e.MaxModelLen, e.PID, e.ExpectedRanks = 64, 32768, 4242, 2
	e.GPUUUIDs = []string{"GPU-1"}
	e.GPUMemory = []wire.GPUMemory{{UUID: "GPU-1", UsedBytes: 30 << 30}}
	e.Load = wire.Load{Running: 8, Waiting: 1, KVUsage: 0.4, StaleSeconds: 1,
		Ranks: []wire.RankLoad{{DPRank: 0, Running: 4, KVUsage: 0.4}, {DPRank: 1, Running: 4, Waiting: 1, KVUsage: 0.3}}}
	e.Pace = &wire.Pace{At: at, WindowSeconds: 30, SecondsPerToken: 0.02, Batch: 8, TokenBatch: 8, ThroughputTPS: 400, PromptTPS: 900,
		Recent: &wire.PaceSpan{WindowSeconds: 15, SecondsPerToken: 0.02, Batch: 8, TokenBatch: 8, PromptTPS: 900}}
	e.Passive = &wire.Passive{At: at, WindowSeconds: 30, ThroughputTPS: 790, Concurrency: 32, Spread: 0.1}
	g := wire.GPU{Index: 0, UUID: "GPU-1", Name: "NVIDIA H100", MemoryTotal: 80 << 30, MemoryFree: 40 << 30, MemoryUsed: 40 << 30,
		SMClockMHz: 1700, SMClockMaxMHz: 1980, MemClockMHz: 2600, MemClockMaxMHz: 2619, TemperatureC: 60, PowerDrawW: 400, PowerLimitW: 700, UtilizationPercent: 90}
	return wire.Snapshot{Node: "evil", At: at, GPUs: []wire.GPU{g}, Engines: []wire.Engine{e}}
}

// numberPaths lists the numeric and time fields reachable from t (through structs,
// pointers and the first element of slices), as dotted paths.
func numberPaths(t reflect.Type, prefix string) []string {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice:
		return numberPaths(t.Elem(), prefix+"[0]")
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			return []string{prefix}
		}
		var out []string
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() {
				out = append(out, numberPaths(f.Type, prefix+"."+f.Name)...)
			}
		}
		return out
	case reflect.Float64, reflect.Int, reflect.Int64, reflect.Uint64:
		return []string{prefix}
	}
	return nil
}

// setNumber sets the number at path in v to x (integers to their largest
// value for an x above 1e300, else to 1; times to the last second of year
// 9999, else the first of year 1), creating no elements: false
// when the path passes an empty slice or a nil pointer.
func setNumber(v reflect.Value, path string, x float64) bool {
	for path != "" {
		switch {
		case len(path) >= 3 && path[:3] == "[0]":
			path = path[3:]
			if v.Kind() == reflect.Pointer {
				if v.IsNil() {
					return false
				}
				v = v.Elem()
				continue
			}
			if v.Len() == 0 {
				return false
			}
			v = v.Index(0)
		default:
			path = path[1:]
			end := len(path)
			for i, c := range path {
				if c == '.' || c == '[' {
					end = i
					break
				}
			}
			v, path = v.FieldByName(path[:end]), path[end:]
		}
	}
	if v.Type() == reflect.TypeFor[time.Time]() {
		// The ends of what RFC 3339 writes: a time past them does not marshal.
		v.Set(reflect.ValueOf(map[bool]time.Time{true: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
			false: time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC)}[x > 1e300]))
		return true
	}
	switch v.Kind() {
	case reflect.Float64:
		v.SetFloat(x)
	case reflect.Int, reflect.Int64:
		v.SetInt(map[bool]int64{true: math.MaxInt64, false: 1}[x > 1e300])
	case reflect.Uint64:
		v.SetUint(map[bool]uint64{true: math.MaxUint64, false: 1}[x > 1e300])
	}
	return true
}
