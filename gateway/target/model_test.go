package target

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"heft/gateway/coord"
	"heft/shared/view"
)

const model = "Qwen/Qwen3-8B"

func worker(id, url, state string, weight *float64) coord.Worker {
	return coord.Worker{ID: id, Model: model, URL: url, State: state, Weight: weight}
}

func f(x float64) *float64 { return &x }

func TestForModelStates(t *testing.T) {
	ws := []coord.Worker{
		worker("a", "http://10.0.0.1:8000", view.StateAdmitted, f(1.37)),
		worker("b", "http://10.0.0.2:8000", view.StateHeld, nil),
		worker("c", "http://10.0.0.3:8000", view.StateOffline, nil),
		worker("d", "http://10.0.0.4:8000", view.StatePending, nil),
		worker("e", "http://10.0.0.5:8000", view.StateMeasuring, nil),
		worker("f", "http://10.0.0.6:8000", view.StateAdmitted, f(0)),                                                 // weight 0: drained
		worker("g", "http://10.0.0.7:8000", view.StateAdmitted, nil),                                                  // admitted without a weight: drained
		worker("h", "http://10.0.0.8:8000", view.StateStale, f(0.8)),                                                  // agent gone, engine not known down: serving
		{ID: "i", Model: model, URL: "http://10.0.0.9:8000", State: view.StateAdmitted, Weight: f(0), Draining: true}, // measured: drained quietly
		{ID: "other", Model: "other", URL: "http://10.0.0.12:8000", State: view.StateAdmitted, Weight: f(1)},
	}
	m, problems := ForModel(model, ws)
	// The two weightless admitted workers are drained, and said so.
	if len(problems) != 2 || problems[0] != "worker f is admitted with weight 0: drained" ||
		problems[1] != "worker g is admitted without a weight: drained" {
		t.Fatalf("problems: %q", problems)
	}
	if len(m.Backends) != 9 {
		t.Fatalf("got %d backends, want 9 (the other model's worker left out): %+v", len(m.Backends), m.Backends)
	}
	serving := m.Serving()
	if len(serving) != 2 || serving[0].WorkerID != "a" || serving[0].Weight != 1.37 || serving[0].Address != "10.0.0.1:8000" ||
		serving[1].WorkerID != "h" || serving[1].Weight != 0.8 {
		t.Fatalf("serving = %+v, want a at 1.37 and the stale h at 0.8", serving)
	}
	for _, b := range m.Backends[1:7] {
		if b.Serving || b.Weight != 0 {
			t.Errorf("%s (%s) serves with weight %g; every non-admitted or weightless worker is drained", b.WorkerID, b.State, b.Weight)
		}
	}
}

func TestForModelAllHeldAndSingle(t *testing.T) {
	m, _ := ForModel(model, []coord.Worker{
		worker("a", "http://10.0.0.1:8000", view.StateHeld, nil),
		worker("b", "http://10.0.0.2:8000", view.StateHeld, nil),
	})
	if len(m.Backends) != 2 || len(m.Serving()) != 0 {
		t.Fatalf("all held: %+v; want both listed and none serving", m)
	}
	m, _ = ForModel(model, []coord.Worker{worker("a", "http://10.0.0.1:8000", view.StateAdmitted, f(1))})
	if len(m.Serving()) != 1 {
		t.Fatalf("a single admitted worker must serve: %+v", m)
	}
	m, _ = ForModel("nobody-serves-this", []coord.Worker{worker("a", "http://10.0.0.1:8000", view.StateAdmitted, f(1))})
	if len(m.Backends) != 0 {
		t.Fatalf("unknown model: %+v", m)
	}
}

// An engine restarted with other launch arguments is a new worker at the
// same address while the old one shows offline: the gateway follows the
// one that serves, and among equals the one measured last.
func TestForModelSameAddress(t *testing.T) {
	old := worker("old", "http://10.0.0.1:8000", view.StateOffline, nil)
	cur := worker("new", "http://10.0.0.1:8000", view.StateAdmitted, f(2))
	for _, order := range [][]coord.Worker{{old, cur}, {cur, old}} {
		m, _ := ForModel(model, order)
		if len(m.Backends) != 1 || m.Backends[0].WorkerID != "new" || !m.Backends[0].Serving {
			t.Fatalf("got %+v, want the admitted worker", m.Backends)
		}
	}
	t1, t2 := time.Unix(100, 0), time.Unix(200, 0)
	a := worker("a", "http://10.0.0.1:8000", view.StateHeld, nil)
	a.MeasuredAt = &t1
	b := worker("b", "http://10.0.0.1:8000", view.StateMeasuring, nil)
	b.MeasuredAt = &t2
	for _, order := range [][]coord.Worker{{a, b}, {b, a}} {
		m, _ := ForModel(model, order)
		if m.Backends[0].WorkerID != "b" {
			t.Fatalf("got %s, want the one measured last", m.Backends[0].WorkerID)
		}
	}
}

func TestAddress(t *testing.T) {
	cases := []struct {
		url, address, want, scheme string
		bad                        bool
	}{
		{url: "http://10.0.0.5:8000", want: "10.0.0.5:8000", scheme: "http"},
		{url: "https://gpu-a.example", want: "gpu-a.example:443", scheme: "https"},
		{url: "http://gpu-a", want: "gpu-a:80", scheme: "http"},
		{url: "http://[fd00::5]:8000/v1", want: "[fd00::5]:8000", scheme: "http"},
		{url: "http://127.0.0.1:8000", address: "10.0.0.5:8000", want: "10.0.0.5:8000", scheme: "http"}, // the API's address wins
		{url: "http://127.0.0.1:8000", address: "10.0.0.5", bad: true},
		{url: "not a url", bad: true},
		{url: "unix:///run/x.sock", bad: true},
		// What an agent may advertise that became gateway configuration:
		// nginx read "server unix:80" as a unix socket.
		{url: "http://unix:80", bad: true},
		{url: "http://10.0.0.5:8000", address: "unix:80", bad: true},
		{url: "http://10.0.0.5:8000", address: "evil\nserver x:80", bad: true},
		{url: "http://10.0.0.5:8000", address: "[::1]:x", bad: true},
		{url: "http://10.0.0.5:8000", address: "0.0.0.0:8000", bad: true},
		{url: "http://10.0.0.5:8000", address: "a;b:80", bad: true},
	}
	for _, c := range cases {
		t.Run(c.url+" "+c.address, func(t *testing.T) {
			w := coord.Worker{ID: "x", URL: c.url, Address: c.address}
			got, scheme, err := Address(w)
			if c.bad {
				if err == nil {
					t.Fatalf("Address = %q, want an error", got)
				}
				return
			}
			if err != nil || got != c.want || scheme != c.scheme {
				t.Fatalf("Address = %q %q %v, want %q %q", got, scheme, err, c.want, c.scheme)
			}
		})
	}
	m, problems := ForModel(model, []coord.Worker{worker("bad", "nope", view.StateAdmitted, f(1))})
	if len(m.Backends) != 0 || len(problems) != 1 {
		t.Fatalf("a worker without an address: %+v %v", m, problems)
	}
}

func TestResolve(t *testing.T) {
	ctx := context.Background()
	a, err := Resolve(ctx, "127.0.0.1:8000")
	if err != nil || a.String() != "127.0.0.1:8000" {
		t.Fatalf("Resolve = %v %v", a, err)
	}
	a, err = Resolve(ctx, "localhost:8000")
	if err != nil || !a.Addr().IsLoopback() || a.Port() != 8000 {
		t.Fatalf("Resolve(localhost) = %v %v", a, err)
	}
	if _, err := Resolve(ctx, "no-such-host.invalid:80"); err == nil {
		t.Fatal("an unknown host resolved")
	}
	for _, addr := range []string{"0.0.0.0:80", "[::]:80", "224.0.0.1:80", "[fe80::1%lo]:80"} {
		if a, err := Resolve(ctx, addr); err == nil {
			t.Errorf("Resolve(%q) = %v, want an error", addr, a)
		}
	}
}

// A weight that is not a finite number drains the worker, as one not
// above zero does.
func TestForModelInfiniteWeight(t *testing.T) {
	m, problems := ForModel(model, []coord.Worker{worker("a", "http://10.0.0.1:8000", view.StateAdmitted, f(math.Inf(1)))})
	if len(m.Backends) != 1 || m.Backends[0].Serving || len(problems) != 1 {
		t.Fatalf("%+v %v", m, problems)
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"gpu-a/vllm-0": "gpu-a/vllm-0",
		"k\nlisten x":  `"k\nlisten x"`,
		"k\u2028x":     `"k\u2028x"`,
		"\xff":         `"\xff"`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %s, want %s", in, got, want)
		}
	}
	if got := Printable(strings.Repeat("k", 1000)); len(got) != 200 {
		t.Errorf("Printable of 1000 bytes is %d long", len(got))
	}
}

func TestClean(t *testing.T) {
	m := Model{Name: model, Backends: []Backend{
		{Address: "10.0.0.1:80", Scheme: "http", WorkerID: "a", Serving: true, Weight: 1, MaxConcurrency: -3},
		{Address: "10.0.0.1:80", Scheme: "http", WorkerID: "dup"},
		{Address: "unix:80", Scheme: "http", WorkerID: "k\nx"},
		{Address: "10.0.0.2:80", Scheme: "gopher", WorkerID: "s"},
		{Address: "10.0.0.3:80", Scheme: "https", WorkerID: "nan", Serving: true, Weight: math.NaN()},
	}}
	clean, leftOut := Clean(m)
	if len(clean.Backends) != 1 || clean.Backends[0].MaxConcurrency != 0 || len(leftOut) != 4 || !strings.Contains(leftOut[1], `"k\nx"`) {
		t.Fatalf("%+v %q", clean, leftOut)
	}
}

func TestReasons(t *testing.T) {
	err := fmt.Errorf("apply: %w", errors.Join(Failf(ReasonNoSlot, "x"), errors.New("y")))
	if got := Reason(err); got != ReasonNoSlot {
		t.Fatalf("Reason = %q", got)
	}
	if got := Reason(errors.New("plain")); got != ReasonOther {
		t.Fatalf("Reason = %q", got)
	}
}

// A prefill backend serves each admitted worker with its prefill weight;
// one without a prefill weight yet is drained there, while it serves in
// the decode backend.
func TestForModelKindPrefill(t *testing.T) {
	a := worker("a", "http://10.0.0.1:8000", view.StateAdmitted, f(1.35))
	a.PrefillWeight, a.MaxContextTokens = f(0.41), func(n int64) *int64 { return &n }(40960)
	b := worker("b", "http://10.0.0.2:8000", view.StateAdmitted, f(0.65)) // no prefill measurement yet
	c := worker("c", "http://10.0.0.3:8000", view.StateHeld, nil)
	c.PrefillWeight = f(2) // a held worker never serves
	ws := []coord.Worker{a, b, c}
	m, _ := ForSelection(model, Selection{Kind: view.WeightPrefill}, ws)
	if s := m.Serving(); len(s) != 1 || s[0].WorkerID != "a" || s[0].Weight != 0.41 || s[0].MaxContextTokens != 40960 {
		t.Fatalf("prefill serving %+v", s)
	}
	if len(m.Backends) != 3 {
		t.Errorf("every worker is listed, drained where it does not serve: %+v", m.Backends)
	}
	d, _ := ForModel(model, ws)
	if s := d.Serving(); len(s) != 2 || s[0].Weight != 1.35 || s[1].Weight != 0.65 {
		t.Errorf("decode serving %+v", s)
	}
	// A long-context backend serves only the workers known to hold its
	// longest conversations: b's context is unknown.
	long, _ := ForSelection(model, Selection{MinContextTokens: 32768}, ws)
	if s := long.Serving(); len(s) != 1 || s[0].WorkerID != "a" || s[0].Weight != 1.35 {
		t.Errorf("min context 32,768: serving %+v", s)
	}
	if none, _ := ForSelection(model, Selection{MinContextTokens: 65536}, ws); len(none.Serving()) != 0 || len(none.Backends) != 3 {
		t.Errorf("min context 65,536: %+v", none)
	}
}

type plain struct{ Target }

func TestWithSelection(t *testing.T) {
	var base Target = plain{}
	if SelectionOf(base) != (Selection{Kind: view.WeightDecode}) || WithSelection(base, Selection{}) != base ||
		WithSelection(base, Selection{Kind: view.WeightDecode}) != base {
		t.Error("a plain target applies the decode weight to every worker, unwrapped")
	}
	want := Selection{Kind: view.WeightPrefill, MinContextTokens: 8192}
	if got := SelectionOf(WithSelection(base, want)); got != want {
		t.Errorf("selection %+v", got)
	}
}
