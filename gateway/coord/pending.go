package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// PendingEvery is how often a session reads the nodes waiting for
// approval when Config.PendingEvery is unset.
const PendingEvery = 10 * time.Second

// errNoPendingRoute is a coordinator older than GET /api/v1/pending-nodes.
var errNoPendingRoute = errors.New("the coordinator has no GET /api/v1/pending-nodes (older than heft-sync)")

// PendingNodes reads GET /api/v1/pending-nodes once: the names of the
// nodes waiting for an admin's approval, in name order.
func (f *Follower) PendingNodes(ctx context.Context) ([]string, error) {
	data, err := f.get(ctx, "/api/v1/pending-nodes")
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound {
		return nil, errNoPendingRoute
	}
	if err != nil {
		return nil, err
	}
	var nodes *[]string
	err = decodeObject(data, map[string]func(*json.Decoder) error{
		"nodes": func(dec *json.Decoder) (err error) {
			nodes, err = decodeList(dec, func(dec *json.Decoder) (n string, err error) { return n, dec.Decode(&n) })
			return err
		},
	})
	if err != nil {
		return nil, fmt.Errorf("GET /api/v1/pending-nodes: %w", err)
	}
	if nodes == nil || slices.Contains(*nodes, "") {
		return nil, fmt.Errorf("%w: GET /api/v1/pending-nodes needs a \"nodes\" list of names", ErrGarbage)
	}
	slices.Sort(*nodes)
	return slices.Compact(*nodes), nil
}

// pendingReader hands Hooks.Pending the pending nodes, for one session.
// A read that fails hands out nothing, so the syncer keeps the last list
// it was given; each new failure is logged once.
type pendingReader struct {
	f       *Follower
	lastErr string
}

// read reads once; it returns false when there is no point reading again
// (a coordinator without the route, or ctx ended).
func (p *pendingReader) read(ctx context.Context) bool {
	names, err := p.f.PendingNodes(ctx)
	if ctx.Err() != nil {
		return false
	}
	switch {
	case errors.Is(err, errNoPendingRoute):
		p.f.hooks.Pending(nil) // a list from another coordinator does not hold for this one
		p.f.log.Info("the coordinator does not say which nodes wait for approval; a node it holds for approval is drained after keep_unlisted")
		return false
	case err != nil:
		if msg := err.Error(); msg != p.lastErr {
			p.lastErr = msg
			p.f.log.Warn("could not read the nodes waiting for approval; the last list read holds", "error", err)
		}
	default:
		if p.lastErr != "" {
			p.f.log.Info("reading the nodes waiting for approval again")
		}
		p.lastErr = ""
		p.f.hooks.Pending(names)
	}
	return true
}

// watch reads every PendingEvery until ctx ends (the session's end).
func (p *pendingReader) watch(ctx context.Context) {
	every := p.f.cfg.PendingEvery
	if every <= 0 {
		every = PendingEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if !p.read(ctx) {
				return
			}
		}
	}
}
