package sim

import (
	"maps"
	"net/http"
	"sync"
)

// LoadHeader marks a chat request as a benchmark's load; its value is a
// label (for instance the gateway it came through). A request without it
// is someone else's: on a benchmark's fleet, a heft probe's.
const LoadHeader = "X-Heft-Load"

// MeetingsPath is where heft-sim reports, as JSON Meetings, how many
// load requests shared the engine with another request: the benchmark's
// count of "requests that met a probe", read at the engine rather than
// from what heft says it did.
const MeetingsPath = "/heft-sim/meetings"

// Meetings counts, per load label, the load requests the engine served
// and those of them that were in flight on it at some moment together
// with a request that carried no LoadHeader (from its submission to the
// end of its answer).
type Meetings struct {
	Load  map[string]LoadCount `json:"load"`
	Other int64                `json:"other_requests"`
}

// LoadCount is one label's share of Meetings.
type LoadCount struct {
	Requests int64 `json:"requests"`
	MetOther int64 `json:"met_other"`
}

// meetings tracks what is in flight; one per server.
type meetings struct {
	mu     sync.Mutex
	others int                    // requests without LoadHeader in flight
	load   map[*loadMark]struct{} // load requests in flight
	counts Meetings
}

type loadMark struct {
	label string
	met   bool
}

// begin records a request entering the engine and returns the call that
// records its end. label "" is another's request.
func (m *meetings) begin(label string) (end func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counts.Load == nil {
		m.counts.Load = map[string]LoadCount{}
		m.load = map[*loadMark]struct{}{}
	}
	if label == "" {
		m.others++
		m.counts.Other++
		for mk := range m.load {
			m.meet(mk)
		}
		return func() {
			m.mu.Lock()
			m.others--
			m.mu.Unlock()
		}
	}
	mk := &loadMark{label: label}
	c := m.counts.Load[label]
	c.Requests++
	m.counts.Load[label] = c
	if m.others > 0 {
		m.meet(mk)
	}
	m.load[mk] = struct{}{}
	return func() {
		m.mu.Lock()
		delete(m.load, mk)
		m.mu.Unlock()
	}
}

// meet counts a load request's first meeting with another request.
func (m *meetings) meet(mk *loadMark) {
	if mk.met {
		return
	}
	mk.met = true
	c := m.counts.Load[mk.label]
	c.MetOther++
	m.counts.Load[mk.label] = c
}

// snapshot returns the counts so far.
func (m *meetings) snapshot() Meetings {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := Meetings{Load: maps.Clone(m.counts.Load), Other: m.counts.Other}
	if out.Load == nil {
		out.Load = map[string]LoadCount{}
	}
	return out
}

func (s *Server) handleMeetings(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.meet.snapshot())
}
