package coord

import (
	"errors"
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
