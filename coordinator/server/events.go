package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/view"
)

// Changes is the data of an "event: changes" on GET /api/v1/events: the
// workers that changed (whole, as GET /api/v1/workers shows them) and the
// IDs of those that left the fleet.
type Changes struct {
	Workers []view.Worker `json:"workers"`
	Removed []string      `json:"removed"`
}

// events is GET /api/v1/events: server-sent events for the dashboard and
// heft-sync. The first event is "workers" with the whole fleet (as GET
// /api/v1/workers), so a new subscriber starts complete; after it come
// "changes" events with only what changed, at most one per sseMinGap; a
// "workers" event again if the subscriber fell so far behind that the
// removals it missed were forgotten. A ": ping" comment goes out every
// ssePingEvery so proxies keep the stream open.
//
// A subscriber's backlog is the sequence number it has seen, not a queue:
// what changed is read from the fleet when the subscriber can take it. A
// subscriber that does not take a write within sseWriteTimeout is dropped
// (its EventSource reconnects and starts again from a whole fleet).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)

	changes, unsubscribe := s.fleet.Changes()
	defer unsubscribe()

	write := func(chunk []byte) bool {
		// Deadline errors only mean the writer cannot set one; carry on.
		_ = rc.SetWriteDeadline(time.Now().Add(s.lim.sseWriteTimeout))
		if _, err := w.Write(chunk); err != nil {
			s.log.Debug("event stream subscriber dropped", "source", s.clientIP(r), "error", err)
			return false
		}
		return rc.Flush() == nil
	}
	var seen uint64
	var last time.Time
	send := func() bool {
		d := s.fleet.Since(seen)
		seen, last = d.Seq, time.Now()
		name, body := "changes", any(nil)
		switch {
		case d.Full:
			if d.Workers == nil {
				d.Workers = []view.Worker{}
			}
			name, body = "workers", view.Workers{Workers: d.Workers}
		case len(d.Workers) == 0 && len(d.Removed) == 0:
			return true
		default:
			body = deltaBody(d)
		}
		data, err := json.Marshal(body)
		if err != nil {
			s.log.Error("encode an event", "error", err)
			return false
		}
		return write(fmt.Appendf(nil, "event: %s\ndata: %s\n\n", name, data))
	}
	if !send() {
		return
	}

	ping := time.NewTicker(s.lim.ssePingEvery)
	defer ping.Stop()
	// pending holds a change that arrived too soon after the last send.
	var pending <-chan time.Time
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.stopping:
			return
		case <-ping.C:
			if !write([]byte(": ping\n\n")) {
				return
			}
		case _, ok := <-changes:
			if !ok {
				return
			}
			if pending != nil {
				continue // a send is already due
			}
			if wait := s.lim.sseMinGap - time.Since(last); wait > 0 {
				pending = time.After(wait)
				continue
			}
			if !send() {
				return
			}
		case <-pending:
			pending = nil
			if !send() {
				return
			}
		}
	}
}

func deltaBody(d fleet.Delta) Changes {
	c := Changes{Workers: d.Workers, Removed: d.Removed}
	if c.Workers == nil {
		c.Workers = []view.Worker{}
	}
	if c.Removed == nil {
		c.Removed = []string{}
	}
	return c
}
