package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"heft/coordinator/fleet"
	"heft/coordinator/web"
	"heft/shared/view"
)

// Handler is the coordinator's whole HTTP surface.
//
// Reads (/api/v1/workers..., /api/v1/models..., /api/v1/events, /metrics)
// are open unless a viewer token is configured; then they need the viewer
// or the admin token as "Authorization: Bearer <token>" or, for browsers'
// EventSource which cannot set headers, as ?token=<token>. The dashboard's
// static files are always served: they hold no data. Admin actions need the
// admin token in the header; agents the agent token.
//
// Every route answers a method it does not serve with 405 and an Allow
// header, and every API error is {"error": "..."}.
func (s *Server) Handler() http.Handler {
	s.handlerOnce.Do(func() {
		mux := http.NewServeMux()
		mux.Handle("/api/v1/agent", get(s.hub.handleAgent))
		mux.Handle("/api/v1/workers", get(s.read(s.listWorkers)))
		mux.HandleFunc("/api/v1/workers/{rest...}", s.workerRoute)
		mux.Handle("/api/v1/nodes", get(s.nodeRead(s.listNodes)))
		mux.HandleFunc("/api/v1/nodes/{rest...}", s.nodeRoute)
		mux.Handle("/api/v1/pending-nodes", get(s.read(s.listPendingNodes))) // names only: heft-sync's fail-static
		mux.Handle("/api/v1/models", get(s.read(s.listModels)))
		mux.Handle("/api/v1/models/{rest...}", get(s.read(s.modelWeights)))
		mux.Handle("/api/v1/events", get(s.read(s.events)))
		mux.Handle("/api/v1/audit", get(s.nodeRead(s.listAudit))) // source addresses: as guarded as the node records
		mux.Handle("/api/v1/backup", get(s.admin(s.backup)))
		mux.Handle("/metrics", get(s.read(s.metrics.handler.ServeHTTP)))
		mux.Handle("/healthz", get(s.healthz))
		mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path))
		})
		mux.Handle("/", get(web.Handler().ServeHTTP))
		s.handler = secureHeaders(s.limitConns(s.limitBody(mux)))
	})
	return s.handler
}

// methods serves one route by request method. HEAD is served by the GET
// handler (net/http drops the body); OPTIONS answers 204 with Allow; any
// other method the route lacks is 405 with Allow.
type methods map[string]http.HandlerFunc

func get(h http.HandlerFunc) methods { return methods{http.MethodGet: h} }

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := m[r.Method]
	if h == nil && r.Method == http.MethodHead {
		h = m[http.MethodGet]
	}
	if h == nil {
		methodNotAllowed(w, r, m.allowed())
		return
	}
	h(w, r)
}

// allowed lists the route's methods in a fixed order, for Allow.
func (m methods) allowed() []string {
	var out []string
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete} {
		if m[method] != nil || (method == http.MethodHead && m[http.MethodGet] != nil) {
			out = append(out, method)
		}
	}
	return out
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow []string) {
	w.Header().Set("Allow", strings.Join(allow, ", "))
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s: use %s", r.Method, r.URL.Path, strings.Join(allow, " or ")))
}

// contentPolicy lets the dashboard load its own files and nothing else:
// no inline script or style, no framing, no plugins, API calls and the
// event stream to this origin only.
const contentPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// secureHeaders sets, on every answer, what keeps a browser from running
// or framing anything the dashboard did not ship, from guessing content
// types, and from sending the page's address (which may hold ?token=)
// elsewhere.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// limitBody caps request bodies; the websocket has its own read limit.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.lim.maxBody {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", s.lim.maxBody))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.lim.maxBody)
		next.ServeHTTP(w, r)
	})
}

func (s *Server) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.readAuth(w, r) {
			h(w, r)
		}
	}
}

func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.adminAuth(w, r) {
			h(w, r)
		}
	}
}

// writeJSON answers v as JSON. "<" and ">" stay as they are (not \u003c),
// so that messages read as written in curl's output.
func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		_ = enc.Encode(view.Error{Error: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, view.Error{Error: msg})
}

// Pages of GET /api/v1/workers. At about 2 KB a worker (bench area 5:
// 20 MB for 10,000), the largest page is about 2 MB.
const (
	defaultPageLimit = 100
	maxPageLimit     = 1000
)

// listWorkers is GET /api/v1/workers. Without parameters it answers every
// worker, as it always has. model, node, state and warning (a code) keep
// the workers that match all of them; limit or cursor ask for one page, in
// ID order, with next_cursor when more follow.
func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	q, err := workersQuery(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ws, more := s.fleet.Find(q)
	out := view.Workers{Workers: ws}
	if out.Workers == nil {
		out.Workers = []view.Worker{}
	}
	if more {
		out.NextCursor = encodeCursor(ws[len(ws)-1].ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// workersQuery reads GET /api/v1/workers' parameters; an unknown, empty
// or repeated one is an error that says what to write instead.
func workersQuery(v url.Values) (fleet.Query, error) {
	var q fleet.Query
	params := map[string]*string{"model": &q.Model, "node": &q.Node, "state": &q.State, "warning": &q.Warning}
	var limit, cursor string
	params["limit"], params["cursor"] = &limit, &cursor
	for _, key := range slices.Sorted(maps.Keys(v)) {
		vals := v[key]
		if key == "token" { // the viewer token, for browsers
			continue
		}
		dst, ok := params[key]
		switch {
		case !ok:
			return q, fmt.Errorf("unknown parameter %q: /api/v1/workers takes model, node, state, warning, limit and cursor", key)
		case len(vals) != 1:
			return q, fmt.Errorf("parameter %q is given %d times: give it once", key, len(vals))
		case vals[0] == "":
			return q, fmt.Errorf("parameter %q is empty: give a value or leave it out", key)
		}
		*dst = vals[0]
	}
	if q.State != "" && !slices.Contains(fleet.States, q.State) {
		return q, fmt.Errorf("state %q is not a worker state: use one of %s", q.State, strings.Join(fleet.States, ", "))
	}
	if q.Warning != "" && !slices.Contains(fleet.WarningCodes, q.Warning) {
		return q, fmt.Errorf("warning %q is not a warning code: use one of %s", q.Warning, strings.Join(fleet.WarningCodes, ", "))
	}
	if limit == "" && cursor == "" {
		return q, nil
	}
	q.Limit = defaultPageLimit
	if limit != "" {
		n, err := strconv.Atoi(limit)
		if err != nil || n < 1 || n > maxPageLimit {
			return q, fmt.Errorf("limit %q must be a whole number from 1 to %d", limit, maxPageLimit)
		}
		q.Limit = n
	}
	if cursor != "" {
		after, ok := decodeCursor(cursor)
		if !ok {
			return q, fmt.Errorf("cursor %q is not one this API gave: pass next_cursor from the previous page as it is, or start again without cursor", cursor)
		}
		q.After = after
	}
	return q, nil
}

// A cursor is the last ID of a page, encoded so that clients treat it as
// opaque and the format can change.
const cursorPrefix = "w1:"

func encodeCursor(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + lastID))
}

func decodeCursor(c string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", false
	}
	id, ok := strings.CutPrefix(string(b), cursorPrefix)
	return id, ok && id != ""
}

// Worker IDs are capacity keys and model names hold slashes, so the
// routes take the rest of the path; an escaped %2F works as well.
func (s *Server) getWorker(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("rest")
	wk, ok := s.fleet.Worker(id)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no worker %q", id))
		return
	}
	writeJSON(w, http.StatusOK, wk)
}

// Models is the body of GET /api/v1/models.
type Models struct {
	Models []string `json:"models"`
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	ms := s.fleet.Models()
	if ms == nil {
		ms = []string{}
	}
	writeJSON(w, http.StatusOK, Models{Models: ms})
}

func (s *Server) modelWeights(w http.ResponseWriter, r *http.Request) {
	model, ok := strings.CutSuffix(r.PathValue("rest"), "/weights")
	if !ok || model == "" {
		writeError(w, http.StatusNotFound, "no such route: use /api/v1/models/{model}/weights")
		return
	}
	kind, msg := weightKind(r.URL.Query().Get("kind"), "")
	if msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	if s.renderWeights(w, r, model, kind) { // ?format=haproxy|nginx|litellm (formats.go)
		return
	}
	wt, ok, err := s.fleet.WeightsOf(model, kind)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no model %q", model))
		return
	}
	if wt.Workers == nil {
		wt.Workers = []view.WeightEntry{}
	}
	writeJSON(w, http.StatusOK, wt)
}

// healthStatus is the body of GET /healthz.
type healthStatus struct {
	Status          string `json:"status"`
	AgentsConnected int    `json:"agents_connected"`
	Workers         int    `json:"workers"`
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, healthStatus{Status: "ok", AgentsConnected: s.hub.count(), Workers: len(s.fleet.Workers())})
}
