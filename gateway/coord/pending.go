package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"heft/shared/view"
)

// PendingEvery is how often a session reads the nodes waiting for
// approval when Config.PendingEvery is unset.
const PendingEvery = 10 * time.Second

// errNoPendingRoute is a coordinator older than GET /api/v1/pending-nodes.
var errNoPendingRoute = errors.New("the coordinator has no GET /api/v1/pending-nodes (older than heft-sync)")

// PendingNodes reads GET /api/v1/pending-nodes once: the names of the
// nodes waiting for an admin's approval, in name order.
func (f *Follower) PendingNodes(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.RequestTimeout)
	defer cancel()
	req, err := f.request(ctx, "/api/v1/pending-nodes", "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, &connError{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, errNoPendingRoute
	}
	if err := checkStatus(resp, "GET /api/v1/pending-nodes"); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, &connError{fmt.Errorf("read GET /api/v1/pending-nodes: %w", err)}
	}
	var doc view.PendingNodes
	if len(data) > maxBody {
		return nil, fmt.Errorf("%w: GET /api/v1/pending-nodes answered over %d bytes", ErrGarbage, maxBody)
	}
	if err := decodeOne(data, &doc); err != nil {
		return nil, fmt.Errorf("GET /api/v1/pending-nodes: %w", err)
	}
	if doc.Nodes == nil || slices.Contains(doc.Nodes, "") {
		return nil, fmt.Errorf("%w: GET /api/v1/pending-nodes needs a \"nodes\" list of names", ErrGarbage)
	}
	slices.Sort(doc.Nodes)
	return slices.Compact(doc.Nodes), nil
}

// watchPending hands Hooks.Pending the pending nodes every PendingEvery
// until ctx ends (the session's end). A read that fails hands out
// nothing, so the syncer keeps the last set it was given; each new
// failure is logged once.
func (f *Follower) watchPending(ctx context.Context) {
	every := f.cfg.PendingEvery
	if every <= 0 {
		every = PendingEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastErr := ""
	for {
		names, err := f.PendingNodes(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, errNoPendingRoute):
			f.log.Info("the coordinator does not say which nodes wait for approval; a node it holds for approval is drained after keep_unlisted")
			return
		case err != nil:
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				f.log.Warn("could not read the nodes waiting for approval; the last list read holds", "error", err)
			}
		default:
			if lastErr != "" {
				f.log.Info("reading the nodes waiting for approval again")
			}
			lastErr = ""
			f.hooks.Pending(names)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
