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

// decodeWorkers reads the body of GET /api/v1/workers (and of an
// "event: workers"): {"workers":[...]}. A document without the workers
// list, with trailing data, or with a worker that lacks an ID or model or
// carries a weight below zero is refused whole: heft-sync never applies
// half of a state it cannot trust.
func decodeWorkers(data []byte) ([]Worker, error) {
	var doc struct {
		Workers *[]Worker `json:"workers"`
	}
	if err := decodeOne(data, &doc); err != nil {
		return nil, err
	}
	if doc.Workers == nil {
		return nil, fmt.Errorf("%w: no \"workers\" list in %q", ErrGarbage, wire.Clip(string(data), 80))
	}
	return checkWorkers(*doc.Workers)
}

// decodeChanges reads an "event: changes": {"workers":[...],"removed":[...]},
// the workers that changed (whole) and the IDs of those that left. Both
// lists must be there; the workers are checked as decodeWorkers checks them.
func decodeChanges(data []byte) (changed []Worker, removed []string, err error) {
	var doc struct {
		Workers *[]Worker `json:"workers"`
		Removed *[]string `json:"removed"`
	}
	if err := decodeOne(data, &doc); err != nil {
		return nil, nil, err
	}
	if doc.Workers == nil || doc.Removed == nil {
		return nil, nil, fmt.Errorf("%w: a changes event needs both \"workers\" and \"removed\": %q", ErrGarbage, wire.Clip(string(data), 80))
	}
	for i, id := range *doc.Removed {
		if id == "" {
			return nil, nil, fmt.Errorf("%w: removed entry %d is empty", ErrGarbage, i)
		}
	}
	ws, err := checkWorkers(*doc.Workers)
	return ws, *doc.Removed, err
}

// decodeOne decodes exactly one JSON object into v.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v: %q", ErrGarbage, err, wire.Clip(string(data), 80))
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return fmt.Errorf("%w: trailing data after the object", ErrGarbage)
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
		return merge(cur, changed, removed), true, nil
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
