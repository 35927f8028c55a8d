package server

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"heft/coordinator/audit"
	"heft/shared/view"
)

// Audit: every admin action is recorded (audit.Log) with the kind of
// token that made it and its source address; GET /api/v1/audit serves the
// record in pages, newest first.

// record writes an admin action of r to the audit log. Every admin route
// takes the admin token, so that is the kind recorded.
func (s *Server) record(r *http.Request, e audit.Entry) {
	e.Token, e.Source = authAdmin, s.clientIP(r)
	s.opts.Audit.Record(e)
}

// workerAction is the audit's name of an admin route on a worker.
func workerAction(route adminRoute, arg adminArg) string {
	action := route.action
	if route.method == http.MethodDelete && action == "pin" {
		action = "unpin"
	}
	if (action == "pin" || action == "unpin") && arg.kind == view.WeightPrefill {
		action += " prefill"
	}
	if action == "hold" && arg.belowFloor {
		action += " below floor"
	}
	return action
}

// workerSummary is what the audit shows of a worker before and after an
// action: its state, weight, pins and the admin's decision.
func workerSummary(w view.Worker) string {
	parts := []string{"state " + w.State}
	num := func(name string, v *float64) {
		if v != nil {
			parts = append(parts, fmt.Sprintf("%s %s", name, strconv.FormatFloat(*v, 'g', 4, 64)))
		}
	}
	num("weight", w.Weight)
	num("pinned", w.PinnedWeight)
	num("prefill pinned", w.PinnedPrefillWeight)
	if w.AdminDecision != "" {
		parts = append(parts, "decision "+w.AdminDecision)
	}
	if w.BelowFloor {
		parts = append(parts, "below floor")
	}
	if w.ProbeStatus != "" {
		parts = append(parts, "probe "+w.ProbeStatus)
	}
	return strings.Join(parts, ", ")
}

// auditPage is the body of GET /api/v1/audit.
type auditPage struct {
	Entries []audit.Entry `json:"entries"`
	// NextCursor asks for the next (older) page as ?cursor=; absent on
	// the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Paging of GET /api/v1/audit.
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
)

// listAudit is GET /api/v1/audit[?limit=N][&cursor=C].
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, before := auditDefaultLimit, uint64(0)
	for key := range q {
		if key != "limit" && key != "cursor" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown parameter %q: /api/v1/audit takes limit and cursor", key))
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > auditMaxLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q is not a number from 1 to %d", v, auditMaxLimit))
			return
		}
		limit = n
	}
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("cursor %q is not one this API gave: pass next_cursor from the previous page", v))
			return
		}
		before = n
	}
	entries, next := s.opts.Audit.Page(before, limit)
	out := auditPage{Entries: entries}
	if next > 0 {
		out.NextCursor = strconv.FormatUint(next, 10)
	}
	writeJSON(w, http.StatusOK, out)
}
