package coord

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

// Worker is one worker as heft-sync reads it from the coordinator: the
// API's own view.Worker. Its address and max_concurrency are empty when a
// coordinator older than them sends none (target.Address copes).
type Worker = view.Worker

// maxBody bounds what one workers document may hold: tens of thousands of
// workers with their history fit; anything larger is not a coordinator.
const maxBody = 64 << 20

// ErrGarbage marks a body or event that is not what the coordinator sends.
var ErrGarbage = errors.New("not a workers document")

// maxWorkers bounds the workers one state holds: far beyond any fleet
// heft runs, and what keeps a body within maxBody from costing gigabytes
// once decoded (64 MiB of {"id":"a"} was 6 million workers and 7 GB).
const maxWorkers = 100_000

// workerFields is the part of a worker heft-sync reads: decoding only it
// skips the rest of each worker (measurement history, GPUs, ranks) without
// keeping it, so a worker costs what heft-sync uses of it, whatever the
// coordinator (or a host that fooled it) put beside that.
type workerFields struct {
	ID               string     `json:"id"`
	Node             string     `json:"node"`
	Model            string     `json:"model"`
	Engine           string     `json:"engine"`
	URL              string     `json:"url"`
	Address          string     `json:"address"`
	State            string     `json:"state"`
	Weight           *float64   `json:"weight"`
	PrefillWeight    *float64   `json:"prefill_weight"`
	MeasuredAt       *time.Time `json:"measured_at"`
	AdminDecision    string     `json:"admin_decision"`
	Draining         bool       `json:"draining"`
	BelowFloor       bool       `json:"below_floor"`
	MaxConcurrency   *int       `json:"max_concurrency"`
	MaxContextTokens *int64     `json:"max_context_tokens"`
}

func (f workerFields) worker() Worker {
	return Worker{ID: f.ID, Node: f.Node, Model: f.Model, Engine: f.Engine, URL: f.URL, Address: f.Address,
		State: f.State, Weight: f.Weight, PrefillWeight: f.PrefillWeight, MeasuredAt: f.MeasuredAt,
		AdminDecision: f.AdminDecision, Draining: f.Draining, BelowFloor: f.BelowFloor,
		MaxConcurrency: f.MaxConcurrency, MaxContextTokens: f.MaxContextTokens}
}

// decodeWorkers reads the body of GET /api/v1/workers (and of an
// "event: workers"): {"workers":[...]}. A document without the workers
// list, with trailing data, with more than maxWorkers workers, or with a
// worker that lacks an ID or model or carries a weight below zero is
// refused whole: heft-sync never applies half of a state it cannot trust.
func decodeWorkers(data []byte) ([]Worker, error) {
	var ws *[]Worker
	err := decodeObject(data, map[string]func(*json.Decoder) error{
		"workers": func(dec *json.Decoder) (err error) { ws, err = decodeWorkerList(dec); return err },
	})
	if err != nil {
		return nil, err
	}
	if ws == nil {
		return nil, fmt.Errorf("%w: no \"workers\" list in %q", ErrGarbage, wire.Clip(string(data), 80))
	}
	return checkWorkers(*ws)
}

// decodeChanges reads an "event: changes": {"workers":[...],"removed":[...]},
// the workers that changed (whole) and the IDs of those that left. Both
// lists must be there; the workers are checked as decodeWorkers checks them.
func decodeChanges(data []byte) (changed []Worker, removed []string, err error) {
	var ws *[]Worker
	var ids *[]string
	err = decodeObject(data, map[string]func(*json.Decoder) error{
		"workers": func(dec *json.Decoder) (err error) { ws, err = decodeWorkerList(dec); return err },
		"removed": func(dec *json.Decoder) (err error) {
			ids, err = decodeList(dec, func(dec *json.Decoder) (id string, err error) { return id, dec.Decode(&id) })
			return err
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if ws == nil || ids == nil {
		return nil, nil, fmt.Errorf("%w: a changes event needs both \"workers\" and \"removed\": %q", ErrGarbage, wire.Clip(string(data), 80))
	}
	for i, id := range *ids {
		if id == "" {
			return nil, nil, fmt.Errorf("%w: removed entry %d is empty", ErrGarbage, i)
		}
	}
	changed, err = checkWorkers(*ws)
	return changed, *ids, err
}

// decodeWorkerList reads a list of workers (null: nil), each as
// workerFields, which is a third of a Worker's size.
func decodeWorkerList(dec *json.Decoder) (*[]Worker, error) {
	fs, err := decodeList(dec, func(dec *json.Decoder) (f workerFields, err error) { return f, dec.Decode(&f) })
	if fs == nil || err != nil {
		return nil, err
	}
	ws := make([]Worker, len(*fs))
	for i, f := range *fs {
		ws[i] = f.worker()
	}
	return &ws, nil
}

// decodeObject reads data as exactly one JSON object, handing the value of
// each key in fields to its decoder as it comes and skipping the others.
func decodeObject(data []byte, fields map[string]func(*json.Decoder) error) error {
	garbage := func(err error) error { return fmt.Errorf("%w: %v: %q", ErrGarbage, err, wire.Clip(string(data), 80)) }
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := expectDelim(dec, '{'); err != nil {
		return garbage(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return garbage(err)
		}
		key, _ := tok.(string)
		if fn, ok := fields[key]; ok {
			err = fn(dec)
		} else {
			err = dec.Decode(new(json.RawMessage))
		}
		if err != nil {
			return garbage(err)
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return garbage(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the object", ErrGarbage)
	}
	return nil
}

// decodeList reads a JSON array of at most maxWorkers elements, each with
// one; null is no list (nil).
func decodeList[T any](dec *json.Decoder, one func(*json.Decoder) (T, error)) (*[]T, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("want a list, got %v", tok)
	}
	out := []T{}
	for dec.More() {
		if len(out) == maxWorkers {
			return nil, fmt.Errorf("a list of more than %d entries", maxWorkers)
		}
		v, err := one(dec)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return &out, expectDelim(dec, ']')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, got %v", want, tok)
	}
	return nil
}

func checkWorkers(ws []Worker) ([]Worker, error) {
	for i, w := range ws {
		switch {
		case w.ID == "":
			return nil, fmt.Errorf("%w: worker %d has no id", ErrGarbage, i)
		case w.Weight != nil && (*w.Weight < 0 || math.IsNaN(*w.Weight)):
			return nil, fmt.Errorf("%w: worker %q has weight %v", ErrGarbage, w.ID, *w.Weight)
		case w.MaxConcurrency != nil && *w.MaxConcurrency < 0:
			return nil, fmt.Errorf("%w: worker %q has max_concurrency %d", ErrGarbage, w.ID, *w.MaxConcurrency)
		}
	}
	if ws == nil {
		ws = []Worker{}
	}
	return ws, nil
}

// applyEvent folds one event of GET /api/v1/events into the current
// workers. The coordinator sends the whole list as "event: workers" first
// (and again if this follower fell too far behind), then "event: changes"
// with only the workers that changed and the IDs of those that left.
// Events of other names are ignored (ok false), so a newer coordinator's
// extra events do no harm. A bad event changes nothing (cur is returned).
func applyEvent(cur []Worker, ev event) (next []Worker, ok bool, err error) {
	switch ev.Name {
	case "workers":
		ws, err := decodeWorkers([]byte(ev.Data))
		if err != nil {
			return cur, false, err
		}
		return ws, true, nil
	case "changes":
		changed, removed, err := decodeChanges([]byte(ev.Data))
		if err != nil {
			return cur, false, err
		}
		next := merge(cur, changed, removed)
		if len(next) > maxWorkers {
			return cur, false, fmt.Errorf("%w: the changes make %d workers, more than %d", ErrGarbage, len(next), maxWorkers)
		}
		return next, true, nil
	default:
		return cur, false, nil
	}
}

// merge returns a new list: cur with the changed workers replaced or
// added and the removed ones taken out, in the coordinator's order (model,
// node, URL, ID). cur is not modified, since whatever it was handed to may
// still hold it.
func merge(cur, changed []Worker, removed []string) []Worker {
	byID := make(map[string]Worker, len(cur)+len(changed))
	for _, w := range cur {
		byID[w.ID] = w
	}
	for _, w := range changed {
		byID[w.ID] = w
	}
	for _, id := range removed {
		delete(byID, id)
	}
	out := make([]Worker, 0, len(byID))
	for _, w := range byID {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Worker) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Node, b.Node), strings.Compare(a.URL, b.URL), strings.Compare(a.ID, b.ID))
	})
	return out
}
