package fleet

import (
	"math"
	"testing"

	"heft/shared/view"
	"heft/shared/wire"
)

func TestMaxConcurrency(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		running int
		weight  *float64
		want    int // 0: nil
	}{
		{0, f(2), 0},                             // the engine's limit unknown: no cap
		{-1, f(1), 0},                            // nonsense is unknown
		{16, nil, 16},                            // not admitted (no weight): what it runs
		{16, f(1), 16},                           // the median worker: exactly what it runs
		{16, f(0.25), 16},                        // never below what it runs, however light
		{16, f(0.999), 16},                       //
		{16, f(1.37), 22},                        // grows with the weight, rounded up
		{16, f(2.22), 36},                        //
		{32, f(8), 256},                          // the heaviest clamp weight
		{24, f(1.0001), 25},                      // a hair above the median rounds up
		{wire.MaxRunning, f(4), wire.MaxRunning}, // bounded
		{16, f(math.Inf(1)), 16},
		{16, f(math.NaN()), 16},
	} {
		got := MaxConcurrency(tc.running, tc.weight)
		switch {
		case tc.want == 0 && got != nil:
			t.Errorf("MaxConcurrency(%d, %v) = %d, want nil", tc.running, tc.weight, *got)
		case tc.want != 0 && (got == nil || *got != tc.want):
			t.Errorf("MaxConcurrency(%d, %v) = %v, want %d", tc.running, tc.weight, got, tc.want)
		}
		if got != nil && *got < tc.running {
			t.Errorf("MaxConcurrency(%d, %v) = %d is below what the engine runs", tc.running, tc.weight, *got)
		}
	}
}

func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		e    wire.Engine
		want string
	}{
		{wire.Engine{URL: "http://127.0.0.1:8000", AdvertiseURL: "http://10.0.0.5:8000"}, "10.0.0.5:8000"},
		{wire.Engine{URL: "http://10.0.0.6:8000"}, "10.0.0.6:8000"},
		{wire.Engine{URL: "https://gpu-a.example/v1"}, "gpu-a.example:443"},
		{wire.Engine{URL: "http://127.0.0.1:8000"}, "127.0.0.1:8000"},
		{wire.Engine{URL: "not a url"}, ""},
	} {
		if got := Address(tc.e); got != tc.want {
			t.Errorf("Address(%+v) = %q, want %q", tc.e, got, tc.want)
		}
	}
}

// The API's workers and weight table carry the address and the cap.
func TestViewsCarryAddressAndCap(t *testing.T) {
	h := newHarness(t)
	fast := engine("fast", "http://127.0.0.1:8000", "m")
	fast.AdvertiseURL, fast.MaxRunning = "http://10.0.0.5:8000", 16
	slow := engine("slow", "http://10.0.0.6:8000", "m")
	slow.MaxRunning = 16
	h.admit("n1", fast, 300)
	h.admit("n2", slow, 100)
	w := h.worker("fast")
	if w.Address != "10.0.0.5:8000" || w.URL != "http://127.0.0.1:8000" || w.MaxRunning == nil || *w.MaxRunning != 16 {
		t.Errorf("fast: address %q url %q max_running %v", w.Address, w.URL, w.MaxRunning)
	}
	// Weights 1.5 and 0.5 (median 200): caps 24 and 16.
	if w.MaxConcurrency == nil || *w.MaxConcurrency != 24 {
		t.Errorf("fast: max_concurrency %v, want 24", w.MaxConcurrency)
	}
	if s := h.worker("slow"); s.Address != "10.0.0.6:8000" || s.MaxConcurrency == nil || *s.MaxConcurrency != 16 {
		t.Errorf("slow: address %q max_concurrency %v, want 16", s.Address, s.MaxConcurrency)
	}
	table, _ := h.f.Weights("m")
	for _, e := range table.Workers {
		if e.Address == "" || e.MaxConcurrency == nil {
			t.Errorf("weight entry %+v lacks address or max_concurrency", e)
		}
	}
	if _, ok := warning(w, wire.CodeNotRoutable); ok {
		t.Errorf("fast is advertised at a routable address, yet warned: %+v", w.Warnings)
	}
	// An engine on loopback with nothing better to offer is warned about,
	// and still admitted: a gateway on its node reaches it.
	local := engine("local", "http://127.0.0.1:8001", "m")
	local.Listen = []string{"127.0.0.1:8001"}
	h.admit("n3", local, 200)
	lw := h.worker("local")
	if x, ok := warning(lw, wire.CodeNotRoutable); !ok || x.Severity != wire.SeverityWarning || lw.State != view.StateAdmitted || lw.Address != "127.0.0.1:8001" {
		t.Errorf("local: state %s address %q warnings %+v", lw.State, lw.Address, lw.Warnings)
	}
}
