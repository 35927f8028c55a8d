package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// events is GET /api/v1/events: server-sent events for the dashboard. It
// sends "event: workers" with the whole view.Workers on connect and after
// each fleet change, at most one per sseMinGap, and a ": ping" comment
// every ssePingEvery so proxies keep the stream open. It ends when the
// client goes, a write stalls, or the server shuts down.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)

	changes, unsubscribe := s.fleet.Changes()
	defer unsubscribe()

	write := func(chunk string) bool {
		// Deadline errors only mean the writer cannot set one; carry on.
		_ = rc.SetWriteDeadline(time.Now().Add(s.lim.sseWriteTimeout))
		if _, err := fmt.Fprint(w, chunk); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	var last time.Time
	send := func() bool {
		data, err := json.Marshal(s.workers())
		if err != nil {
			s.log.Error("encode workers for the event stream", "error", err)
			return false
		}
		last = time.Now()
		return write("event: workers\ndata: " + string(data) + "\n\n")
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
			if !write(": ping\n\n") {
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
