package coord

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"heft/coordinator/view"
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
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v: %q", ErrGarbage, err, wire.Clip(string(data), 80))
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return nil, fmt.Errorf("%w: trailing data after the object", ErrGarbage)
	}
	if doc.Workers == nil {
		return nil, fmt.Errorf("%w: no \"workers\" list in %q", ErrGarbage, wire.Clip(string(data), 80))
	}
	ws := *doc.Workers
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
// workers. Today the coordinator sends the whole list as "event: workers"
// on connect and after every change; should it move to incremental
// changes, this is the one function to teach. Events of other names are
// ignored (ok false), so a newer coordinator's extra events do no harm.
func applyEvent(cur []Worker, ev event) (next []Worker, ok bool, err error) {
	switch ev.Name {
	case "workers":
		ws, err := decodeWorkers([]byte(ev.Data))
		if err != nil {
			return cur, false, err
		}
		return ws, true, nil
	default:
		return cur, false, nil
	}
}
