package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	"heft/coordinator/fleet"
	"heft/coordinator/view"
	"heft/coordinator/web"
)

// Handler is the coordinator's whole HTTP surface.
//
// Reads (/api/v1/workers..., /api/v1/models..., /api/v1/events, /metrics)
// are open unless a viewer token is configured; then they need the viewer
// or the admin token as "Authorization: Bearer <token>" or, for browsers'
// EventSource which cannot set headers, as ?token=<token>. The dashboard's
// static files are always served: they hold no data. Admin actions need the
// admin token in the header; agents the agent token.
func (s *Server) Handler() http.Handler {
	s.handlerOnce.Do(func() {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /api/v1/agent", s.hub.handleAgent)
		mux.HandleFunc("GET /api/v1/workers", s.read(s.listWorkers))
		mux.HandleFunc("GET /api/v1/workers/{rest...}", s.read(s.getWorker))
		mux.HandleFunc("POST /api/v1/workers/{rest...}", s.admin(s.workerAction))
		mux.HandleFunc("DELETE /api/v1/workers/{rest...}", s.admin(s.workerAction))
		mux.HandleFunc("GET /api/v1/models", s.read(s.listModels))
		mux.HandleFunc("GET /api/v1/models/{rest...}", s.read(s.modelWeights))
		mux.HandleFunc("GET /api/v1/events", s.read(s.events))
		mux.Handle("GET /metrics", s.read(s.metrics.handler.ServeHTTP))
		mux.HandleFunc("GET /healthz", s.healthz)
		mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no API route %s %s", r.Method, r.URL.Path))
		})
		mux.Handle("/", web.Handler())
		s.handler = s.limitBody(mux)
	})
	return s.handler
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal(view.Error{Error: "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, view.Error{Error: msg})
}

func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.workers())
}

func (s *Server) workers() view.Workers {
	ws := s.fleet.Workers()
	if ws == nil {
		ws = []view.Worker{}
	}
	return view.Workers{Workers: ws}
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
	wt, ok := s.fleet.Weights(model)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no model %q", model))
		return
	}
	if wt.Workers == nil {
		wt.Workers = []view.WeightEntry{}
	}
	writeJSON(w, http.StatusOK, wt)
}

// pinBody is the body of POST /api/v1/workers/{id}/pin.
type pinBody struct {
	Weight *float64 `json:"weight"`
}

// adminRoute is a method and the last segment of an admin route on a
// worker, /api/v1/workers/{id}/{action}.
type adminRoute struct{ method, action string }

// adminAction is what one admin route does.
type adminAction struct {
	// decode reads the body into the action's argument; nil means the body
	// carries nothing and is drained. A non-zero status refuses the
	// request before the worker is looked up.
	decode func(s *Server, body io.Reader) (arg float64, status int, msg string)
	// run applies the action to a worker that exists.
	run func(s *Server, wk view.Worker, arg float64) error
}

var adminActions = map[adminRoute]adminAction{
	{http.MethodPost, "pin"}: {
		decode: func(s *Server, body io.Reader) (float64, int, string) {
			return decodePin(body, s.opts.PinMin, s.opts.PinMax)
		},
		run: func(s *Server, wk view.Worker, weight float64) error { return s.fleet.Pin(wk.ID, weight) },
	},
	{http.MethodDelete, "pin"}: {run: func(s *Server, wk view.Worker, _ float64) error { return s.fleet.Unpin(wk.ID) }},
	{http.MethodPost, "admit"}: {run: func(s *Server, wk view.Worker, _ float64) error { return s.fleet.Admit(wk.ID) }},
	{http.MethodPost, "hold"}:  {run: func(s *Server, wk view.Worker, _ float64) error { return s.fleet.Hold(wk.ID) }},
	{http.MethodPost, "probe"}: {run: (*Server).probe},
}

// httpError is an action's refusal with its own status and message.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// probe asks the worker's agent for an on-demand measurement.
func (s *Server) probe(wk view.Worker, _ float64) error {
	if !s.hub.connected(wk.Node) {
		return &httpError{http.StatusConflict, fmt.Sprintf("the agent of node %q is not connected; probe once it is back", wk.Node)}
	}
	actions, err := s.fleet.Probe(wk.ID)
	s.hub.route(actions)
	return err
}

// workerAction serves the admin routes in adminActions.
func (s *Server) workerAction(w http.ResponseWriter, r *http.Request) {
	rest := r.PathValue("rest")
	cut := strings.LastIndexByte(rest, '/')
	if cut <= 0 {
		writeError(w, http.StatusNotFound, "no such route: use /api/v1/workers/{id}/pin|probe|admit|hold")
		return
	}
	id, action := rest[:cut], rest[cut+1:]
	act, ok := adminActions[adminRoute{r.Method, action}]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s .../%s: use POST .../{id}/pin|probe|admit|hold or DELETE .../{id}/pin", r.Method, action))
		return
	}
	var arg float64
	var status int
	var msg string
	if act.decode != nil {
		arg, status, msg = act.decode(s, r.Body)
	} else {
		status, msg = drainBody(r.Body)
	}
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	wk, ok := s.fleet.Worker(id)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no worker %q", id))
		return
	}
	if err := act.run(s, wk, arg); err != nil {
		status := actionStatus(err)
		if status == http.StatusInternalServerError {
			s.log.Error("admin action failed", "action", action, "worker", id, "error", err)
			err = fmt.Errorf("%s %s: %w", action, id, err)
		}
		writeError(w, status, err.Error())
		return
	}
	s.log.Info("admin action", "action", r.Method+" "+action, "worker", id, "source", sourceIP(r))
	if wk, ok = s.fleet.Worker(id); !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no worker %q", id))
		return
	}
	writeJSON(w, http.StatusOK, wk)
}

// actionStatus is the HTTP status for an admin action's error.
func actionStatus(err error) int {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.status
	case errors.Is(err, fleet.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, fleet.ErrNotConnected):
		return http.StatusConflict
	case errors.Is(err, fleet.ErrInvalid):
		return http.StatusBadRequest
	default:
		return http.StatusInternalServerError
	}
}

// decodePin reads {"weight": number} with the number within [lo, hi], the
// range computed weights are clamped to. A non-zero status is the error.
func decodePin(body io.Reader, lo, hi float64) (float64, int, string) {
	data, err := io.ReadAll(body)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return 0, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", mbe.Limit)
		}
		return 0, http.StatusBadRequest, "read body: " + err.Error()
	}
	const want = `body must be {"weight": <positive number>}`
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p pinBody
	if err := dec.Decode(&p); err != nil {
		return 0, http.StatusBadRequest, fmt.Sprintf("%s: %v", want, err)
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return 0, http.StatusBadRequest, want + ": trailing data after the object"
	}
	if p.Weight == nil {
		return 0, http.StatusBadRequest, want + ": weight is missing"
	}
	if v := *p.Weight; math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return 0, http.StatusBadRequest, fmt.Sprintf("%s: got %g", want, v)
	}
	if v := *p.Weight; v < lo || v > hi {
		return 0, http.StatusBadRequest, fmt.Sprintf("weight %g is outside [%g, %g] (weight_min, weight_max)", v, lo, hi)
	}
	return *p.Weight, 0, ""
}

// drainBody reads and ignores a body, answering 413 for an oversized one.
func drainBody(body io.Reader) (int, string) {
	if _, err := io.Copy(io.Discard, body); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", mbe.Limit)
		}
		return http.StatusBadRequest, "read body: " + err.Error()
	}
	return 0, ""
}

// health is the body of GET /healthz.
type health struct {
	Status          string `json:"status"`
	AgentsConnected int    `json:"agents_connected"`
	Workers         int    `json:"workers"`
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, health{Status: "ok", AgentsConnected: s.hub.count(), Workers: len(s.fleet.Workers())})
}
