package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"heft/coordinator/audit"
	"heft/coordinator/fleet"
	"heft/shared/view"
)

// Admin actions name their worker one of two ways:
//
//	/api/v1/workers/{id}/{action}     by ID, as GET /api/v1/workers shows it
//	/api/v1/nodes/{node}/{action}     by node, with ?model= or ?url= (the
//	                                  engine's URL) when the node has several
//
// The path and its query name the worker; the body carries only the
// action's argument (pin's {"weight": N}). A name that fits no worker is
// 404, one that fits several is 409 with the candidates, so an operator
// never acts on a worker they did not mean.

// pinBody is the body of POST .../pin: {"weight": 1.5} pins the decode
// weight (PRODUCT.md), {"weight": 1.5, "kind": "prefill"} the prefill
// weight. The kind may come as ?kind= instead, the way DELETE .../pin
// names it.
type pinBody struct {
	Weight *float64 `json:"weight"`
	Kind   string   `json:"kind"`
}

// weightKind reads a weight kind from the ?kind= query and the pin body's
// "kind" (either may be empty, both must agree); empty is the decode
// weight. A non-empty message is the 400 to answer.
func weightKind(query, body string) (string, string) {
	if query != "" && body != "" && query != body {
		return "", fmt.Sprintf("kind %q in the query and %q in the body disagree", query, body)
	}
	kind := cmp.Or(query, body, view.WeightDecode)
	if kind != view.WeightDecode && kind != view.WeightPrefill {
		return "", fmt.Sprintf("kind %q is not %q or %q", kind, view.WeightDecode, view.WeightPrefill)
	}
	return kind, ""
}

// adminArg is what an admin request carries for its action: a pin's
// weight and the kind of weight it is for; a hold's below_floor.
type adminArg struct {
	weight     float64
	kind       string
	belowFloor bool
}

// adminRoute is a method and the last segment of an admin route.
type adminRoute struct{ method, action string }

// adminAction is what one admin route does.
type adminAction struct {
	// decode reads the request's body (and the query parameters in
	// params) into the action's argument; nil means the body carries
	// nothing and is drained. A non-zero status refuses the request
	// before the worker is looked up.
	decode func(s *Server, r *http.Request) (arg adminArg, status int, msg string)
	// params are the query parameters the action itself reads, besides
	// those that name the worker.
	params []string
	// run applies the action to a worker that exists.
	run func(s *Server, wk view.Worker, arg adminArg) error
}

var adminActions = map[adminRoute]adminAction{
	{http.MethodPost, "pin"}: {
		decode: func(s *Server, r *http.Request) (adminArg, int, string) {
			return decodePin(r.Body, r.URL.Query().Get("kind"), s.opts.PinMin, s.opts.PinMax)
		},
		params: []string{"kind"},
		run:    func(s *Server, wk view.Worker, a adminArg) error { return s.fleet.PinKind(wk.ID, a.kind, a.weight) },
	},
	{http.MethodDelete, "pin"}: {
		decode: func(s *Server, r *http.Request) (adminArg, int, string) {
			kind, msg := weightKind(r.URL.Query().Get("kind"), "")
			if msg != "" {
				return adminArg{}, http.StatusBadRequest, msg
			}
			status, msg := drainBody(r.Body)
			return adminArg{kind: kind}, status, msg
		},
		params: []string{"kind"},
		run:    func(s *Server, wk view.Worker, a adminArg) error { return s.fleet.UnpinKind(wk.ID, a.kind) },
	},
	{http.MethodPost, "admit"}: {run: func(s *Server, wk view.Worker, _ adminArg) error { return s.fleet.Admit(wk.ID) }},
	{http.MethodPost, "hold"}:  {decode: decodeHold, params: []string{"below_floor"}, run: (*Server).hold}, // hold.go
	{http.MethodPost, "probe"}: {run: (*Server).probe},
}

const actionList = "pin, probe, admit, hold"

// cutAction splits ".../{action}" when the last segment is an admin
// action.
func cutAction(rest string) (target, action string, ok bool) {
	cut := strings.LastIndexByte(rest, '/')
	if cut <= 0 {
		return "", "", false
	}
	target, action = rest[:cut], rest[cut+1:]
	for r := range adminActions {
		if r.action == action {
			return target, action, true
		}
	}
	return "", "", false
}

// workerRoute serves /api/v1/workers/{id} (GET) and
// /api/v1/workers/{id}/{action}. Worker IDs are capacity keys and may hold
// slashes, so the route takes the rest of the path; an escaped %2F works
// as well.
func (s *Server) workerRoute(w http.ResponseWriter, r *http.Request) {
	id, action, ok := cutAction(r.PathValue("rest"))
	if !ok {
		m := get(s.read(s.getWorker))
		if r.Method == http.MethodPost || r.Method == http.MethodDelete { // most likely a mistyped action
			w.Header().Set("Allow", strings.Join(m.allowed(), ", "))
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s is not allowed on %s, a worker: use GET or HEAD; "+
				"its actions are POST .../{id}/{action}, action one of %s, and DELETE .../{id}/pin", r.Method, r.URL.Path, actionList))
			return
		}
		m.ServeHTTP(w, r)
		return
	}
	s.actionMethods(action, nil, func(url.Values) (view.Worker, error) {
		wk, ok := s.fleet.Worker(id)
		if !ok {
			return view.Worker{}, &httpError{http.StatusNotFound, fmt.Sprintf("no worker %q: GET /api/v1/workers lists the IDs, or act by node at /api/v1/nodes/{node}/%s", id, action)}
		}
		return wk, nil
	}).ServeHTTP(w, r)
}

// nodeRoute serves /api/v1/nodes/{node}/{action}: a worker action by
// node name, or the node's own approve and reject; and /api/v1/nodes/{node}
// itself (GET its record, DELETE to release the name; nodes.go).
func (s *Server) nodeRoute(w http.ResponseWriter, r *http.Request) {
	if m := s.nodeRecordRoute(r.PathValue("rest")); m != nil {
		m.ServeHTTP(w, r)
		return
	}
	node, action, ok := cutAction(r.PathValue("rest"))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no API route %s: use /api/v1/nodes/{node}/{action}, action one of %s, approve, reject; "+
			"or GET or DELETE /api/v1/nodes/{node}", r.URL.Path, actionList))
		return
	}
	s.actionMethods(action, []string{"model", "url"}, func(q url.Values) (view.Worker, error) {
		return s.workerOnNode(node, q.Get("model"), q.Get("url"))
	}).ServeHTTP(w, r)
}

// actionMethods is one action's route: each method it has, run on the
// worker find names; params are the query parameters find reads.
func (s *Server) actionMethods(action string, params []string, find func(url.Values) (view.Worker, error)) methods {
	m := methods{}
	for route, act := range adminActions {
		if route.action == action {
			m[route.method] = s.admin(func(w http.ResponseWriter, r *http.Request) {
				s.runAction(w, r, route, act, params, find)
			})
		}
	}
	return m
}

// runAction decodes the body, finds the worker, applies the action and
// answers the worker as it is afterwards.
func (s *Server) runAction(w http.ResponseWriter, r *http.Request, route adminRoute, act adminAction,
	params []string, find func(url.Values) (view.Worker, error)) {
	q := r.URL.Query()
	if err := onlyParams(q, append(slices.Clone(params), act.params...)); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var arg adminArg
	var status int
	var msg string
	if act.decode != nil {
		arg, status, msg = act.decode(s, r)
	} else {
		status, msg = drainBody(r.Body)
	}
	if status != 0 {
		writeError(w, status, msg)
		return
	}
	wk, err := find(q)
	if err == nil {
		err = act.run(s, wk, arg)
	}
	if err != nil {
		s.writeActionError(w, route, wk.ID, err)
		return
	}
	after, ok := s.fleet.Worker(wk.ID)
	e := audit.Entry{Action: workerAction(route, arg), Target: wk.ID, Node: wk.Node, Old: workerSummary(wk)}
	if ok {
		e.New = workerSummary(after)
	}
	s.record(r, e) // audit.go
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("worker %q was forgotten meanwhile", wk.ID))
		return
	}
	writeJSON(w, http.StatusOK, after)
}

// onlyParams refuses query parameters the route does not read: a
// misspelt selector must not act on some other worker.
func onlyParams(q url.Values, allowed []string) error {
	for _, key := range slices.Sorted(maps.Keys(q)) {
		switch {
		case key == "weight" && !slices.Contains(allowed, key):
			return fmt.Errorf("unknown parameter %q: pin's weight goes in the body, {\"weight\": N}", key)
		case !slices.Contains(allowed, key) && len(allowed) == 0:
			return fmt.Errorf("unknown parameter %q: a route by ID takes none (the path names the worker; pin's weight goes in the body)", key)
		case !slices.Contains(allowed, key):
			return fmt.Errorf("unknown parameter %q: this route takes %s", key, strings.Join(allowed, " and "))
		case len(q[key]) != 1 || q.Get(key) == "":
			return fmt.Errorf("parameter %q must be given once, with a value", key)
		}
	}
	return nil
}

// candidate is one worker a name could mean.
type candidate struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	URL   string `json:"url"`
	State string `json:"state"`
}

// nameError is a name that fits no worker or several: 404 or 409, with
// the node's workers to choose from; or no node name at all: 400.
type nameError struct {
	status     int
	msg        string
	candidates []candidate
}

func (e *nameError) Error() string { return e.msg }

// workerOnNode finds the one worker on node with the model and engine URL
// given (either may be empty).
func (s *Server) workerOnNode(node, model, engineURL string) (view.Worker, error) {
	if err := s.nodeNameError(node); err != nil {
		return view.Worker{}, &nameError{status: http.StatusBadRequest, msg: err.Error() + "; act by worker ID at /api/v1/workers/{id}/..."}
	}
	all, _ := s.fleet.Find(fleet.Query{Node: node})
	if len(all) == 0 {
		return view.Worker{}, &nameError{status: http.StatusNotFound,
			msg: fmt.Sprintf("no worker on node %q: node names are the \"node\" of GET /api/v1/workers", node)}
	}
	var fits []view.Worker
	cands := make([]candidate, len(all))
	for i, wk := range all {
		cands[i] = candidate{ID: wk.ID, Model: wk.Model, URL: wk.URL, State: wk.State}
		if (model == "" || wk.Model == model) && (engineURL == "" || sameURL(wk.URL, engineURL)) {
			fits = append(fits, wk)
		}
	}
	switch {
	case len(fits) == 1:
		return fits[0], nil
	case len(fits) == 0:
		return view.Worker{}, &nameError{status: http.StatusNotFound, candidates: cands,
			msg: fmt.Sprintf("node %q has no worker with %s; pick one of its workers (candidates)", node, selector(model, engineURL))}
	default:
		return view.Worker{}, &nameError{status: http.StatusConflict, candidates: candidatesOf(fits),
			msg: fmt.Sprintf("node %q has %d workers%s: add ?model=MODEL or ?url=ENGINE_URL to pick one (candidates), or act by ID at /api/v1/workers/{id}/...",
				node, len(fits), with(selector(model, engineURL)))}
	}
}

func candidatesOf(ws []view.Worker) []candidate {
	out := make([]candidate, len(ws))
	for i, wk := range ws {
		out[i] = candidate{ID: wk.ID, Model: wk.Model, URL: wk.URL, State: wk.State}
	}
	return out
}

func selector(model, engineURL string) string {
	var parts []string
	if model != "" {
		parts = append(parts, fmt.Sprintf("model %q", model))
	}
	if engineURL != "" {
		parts = append(parts, fmt.Sprintf("url %q", engineURL))
	}
	return strings.Join(parts, " and ")
}

func with(sel string) string {
	if sel == "" {
		return ""
	}
	return " with " + sel
}

// sameURL compares engine URLs, ignoring a trailing slash.
func sameURL(a, b string) bool { return strings.TrimRight(a, "/") == strings.TrimRight(b, "/") }

// httpError is an action's refusal with its own status and message.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// probe asks the worker's agent for an on-demand measurement.
func (s *Server) probe(wk view.Worker, _ adminArg) error {
	if !s.hub.connected(wk.Node) {
		return &httpError{http.StatusConflict, fmt.Sprintf("the agent of node %q is not connected; probe once it is back", wk.Node)}
	}
	actions, err := s.fleet.Probe(wk.ID)
	s.hub.route(actions)
	return err
}

// errorWithCandidates is the body of a 404 or 409 for a worker's name.
type errorWithCandidates struct {
	Error      string      `json:"error"`
	Candidates []candidate `json:"candidates,omitempty"`
}

// writeActionError answers an action that failed.
func (s *Server) writeActionError(w http.ResponseWriter, route adminRoute, id string, err error) {
	if ne := (*nameError)(nil); errors.As(err, &ne) {
		writeJSON(w, ne.status, errorWithCandidates{Error: ne.msg, Candidates: ne.candidates})
		return
	}
	status := actionStatus(err)
	if status == http.StatusInternalServerError {
		s.log.Error("admin action failed", "action", route.action, "worker", id, "error", err)
		err = fmt.Errorf("%s %s: %w", route.action, id, err)
	}
	writeError(w, status, err.Error())
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

// decodePin reads {"weight": number[, "kind": "decode"|"prefill"]} with
// the number within [lo, hi], the range computed weights are clamped to;
// the kind may come as ?kind= instead. A non-zero status is the error.
func decodePin(body io.Reader, queryKind string, lo, hi float64) (adminArg, int, string) {
	data, err := io.ReadAll(body)
	if err != nil {
		status, msg := bodyError(err)
		return adminArg{}, status, msg
	}
	const want = `body must be {"weight": <positive number>}`
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p pinBody
	if err := dec.Decode(&p); err != nil {
		return adminArg{}, http.StatusBadRequest, fmt.Sprintf("%s: %v", want, err)
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return adminArg{}, http.StatusBadRequest, want + ": trailing data after the object"
	}
	kind, msg := weightKind(queryKind, p.Kind)
	if msg != "" {
		return adminArg{}, http.StatusBadRequest, msg
	}
	if p.Weight == nil {
		return adminArg{}, http.StatusBadRequest, want + ": weight is missing"
	}
	if v := *p.Weight; math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return adminArg{}, http.StatusBadRequest, fmt.Sprintf("%s: got %g", want, v)
	}
	if v := *p.Weight; v < lo || v > hi {
		return adminArg{}, http.StatusBadRequest, fmt.Sprintf("weight %g is outside [%g, %g] (weight_min, weight_max)", v, lo, hi)
	}
	return adminArg{weight: *p.Weight, kind: kind}, 0, ""
}

// drainBody reads and ignores a body, answering 413 for an oversized one.
func drainBody(body io.Reader) (int, string) {
	if _, err := io.Copy(io.Discard, body); err != nil {
		return bodyError(err)
	}
	return 0, ""
}

// bodyError is the status and message for a body that could not be read:
// 413 for an oversized one.
func bodyError(err error) (int, string) {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", mbe.Limit)
	}
	return http.StatusBadRequest, "read body: " + err.Error()
}
