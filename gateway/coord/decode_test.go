package coord

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

func TestDecodeWorkers(t *testing.T) {
	good := `{"workers":[{"id":"a","node":"n","model":"m","engine":"vllm","url":"http://10.0.0.1:8000","state":"admitted",
		"throughput_tps":900,"weight":1.37,"pinned_weight":null,"measured_at":null,"ranks":[],"warnings":[],
		"address":"10.0.0.1:8000","max_concurrency":32}]}`
	ws, err := decodeWorkers([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].ID != "a" || *ws[0].Weight != 1.37 || ws[0].Address != "10.0.0.1:8000" || *ws[0].MaxConcurrency != 32 {
		t.Fatalf("decoded %+v", ws)
	}
	if ws, err := decodeWorkers([]byte(`{"workers":[]}`)); err != nil || ws == nil || len(ws) != 0 {
		t.Fatalf("empty fleet: %v %v", ws, err)
	}
	for _, bad := range []string{
		``, `<html>502 Bad Gateway</html>`, `{}`, `{"workers":null}`, `{"workers":{}}`, `[]`,
		`{"workers":[]} trailing`, `{"workers":[{"model":"m"}]}`, `{"workers":[{"id":"a","weight":-1}]}`,
		`{"workers":[{"id":"a","max_concurrency":-3}]}`, `{"workers":[{"id":"a","weight":"1.0"}]}`,
	} {
		if _, err := decodeWorkers([]byte(bad)); !errors.Is(err, ErrGarbage) {
			t.Errorf("decodeWorkers(%q) = %v, want ErrGarbage", bad, err)
		}
	}
}

func TestApplyEvent(t *testing.T) {
	cur := []Worker{{}}
	next, ok, err := applyEvent(cur, event{Name: "hello", Data: "{}"})
	if ok || err != nil || len(next) != 1 {
		t.Fatalf("an unknown event must be ignored: %v %v %v", next, ok, err)
	}
	next, ok, err = applyEvent(cur, event{Name: "workers", Data: "garbage"})
	if ok || err == nil || len(next) != 1 {
		t.Fatalf("a garbage workers event must be refused and keep the state: %v %v %v", next, ok, err)
	}
}

// The coordinator's stream: a whole fleet first, then changes. Changes
// replace, add and remove workers; a bad one is refused whole and leaves
// the state as it was.
func TestApplyChanges(t *testing.T) {
	cur, ok, err := applyEvent(nil, event{Name: "workers", Data: `{"workers":[{"id":"a","model":"m","node":"n1","weight":1},{"id":"b","model":"m","node":"n2","weight":1}]}`})
	if !ok || err != nil || len(cur) != 2 {
		t.Fatalf("first event: %v %v %v", cur, ok, err)
	}
	next, ok, err := applyEvent(cur, event{Name: "changes",
		Data: `{"workers":[{"id":"b","model":"m","node":"n2","weight":2},{"id":"c","model":"m","node":"n0","weight":0.5}],"removed":["a"]}`})
	if !ok || err != nil {
		t.Fatalf("changes: %v %v", ok, err)
	}
	var got []string
	for _, w := range next {
		got = append(got, fmt.Sprintf("%s=%g", w.ID, *w.Weight))
	}
	if strings.Join(got, " ") != "c=0.5 b=2" {
		t.Errorf("after the changes: %v, want c=0.5 b=2 (in the coordinator's order: model, node)", got)
	}
	if *cur[1].Weight != 1 || len(cur) != 2 {
		t.Error("applying changes modified the list handed out before")
	}
	for _, bad := range []string{`{"workers":[]}`, `{"removed":[]}`, `{"workers":[{"id":"x","weight":-1}],"removed":[]}`,
		`{"workers":[],"removed":[""]}`, `{"workers":[],"removed":[]} x`} {
		if same, ok, err := applyEvent(next, event{Name: "changes", Data: bad}); ok || !errors.Is(err, ErrGarbage) || len(same) != 2 {
			t.Errorf("changes %s: %v %v %v", bad, same, ok, err)
		}
	}
}

// allocated is what f allocates, in bytes.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A body within maxBody costs heft-sync what it uses of it, not gigabytes:
// 64 MiB of {"id":"a"} decoded into 6 million workers took 7 GB, and one
// worker's history of 8 MiB of {} became millions of measurement points.
// Past maxWorkers a state is refused whole; what heft-sync does not read
// of a worker is skipped.
func TestHugeBodiesStayBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"workers":[`)
	for i := 0; b.Len() < 8<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":"a"}`)
	}
	b.WriteString(`]}`)
	var err error
	if n := allocated(func() { _, err = decodeWorkers([]byte(b.String())) }); !errors.Is(err, ErrGarbage) ||
		!strings.Contains(err.Error(), "more than 100000") || n > 300<<20 {
		t.Errorf("760,000 workers: %v, %d MB allocated; want refused, within 300 MB", err, n>>20)
	}

	b.Reset()
	b.WriteString(`{"workers":[{"id":"a","model":"m","weight":1,"history":[`)
	for i := 0; b.Len() < 8<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{}`)
	}
	b.WriteString(`],"gpus":[{},{}]}],"removed":["b"]}`)
	var ws []Worker
	var removed []string
	if n := allocated(func() { ws, removed, err = decodeChanges([]byte(b.String())) }); err != nil || len(ws) != 1 ||
		ws[0].ID != "a" || *ws[0].Weight != 1 || len(removed) != 1 || n > 64<<20 {
		t.Errorf("a worker with 8 MiB of history: %v %v, %d MB allocated; want it read, within 64 MB", ws, err, n>>20)
	}
	for _, doc := range []string{`{"workers":[{"id":"a","model":"m"}],"removed":[` + strings.Repeat(`"x",`, maxWorkers) + `"x"]}`} {
		if _, _, err := decodeChanges([]byte(doc)); !errors.Is(err, ErrGarbage) {
			t.Errorf("%d removed IDs: %v, want refused", maxWorkers+1, err)
		}
	}
}
