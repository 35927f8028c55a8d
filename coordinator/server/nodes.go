package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"heft/coordinator/audit"
	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/grammar"
	"heft/shared/settings"
	"heft/shared/view"
)

// Node routes: GET /api/v1/nodes[?state=S], GET /api/v1/nodes/{name},
// POST /api/v1/nodes/{name}/approve|reject, DELETE /api/v1/nodes/{name}
// (release the name: its next connection enrols anew). Worker actions by
// node name share the path (admin.go).

// nodeRecordRoute is the route for a path after /api/v1/nodes/ that names
// a node's record or its approve and reject, or nil for another path.
func (s *Server) nodeRecordRoute(rest string) methods {
	i := strings.LastIndexByte(rest, '/')
	if i <= 0 {
		m := methods{http.MethodGet: s.nodeRead(s.getNode), http.MethodDelete: s.admin(s.releaseNode)}
		if rest == "approve" {
			m[http.MethodPost] = s.admin(s.approveNodes) // approve.go; GET and DELETE still name a node "approve"
		}
		return m
	}
	switch rest[i+1:] {
	case "approve", "reject":
		return methods{http.MethodPost: s.admin(s.nodeAction)}
	}
	return nil
}

// nodeRead guards the node records, which say which names have no
// credential and where each node connects from: the viewer or the admin
// token, always; without a viewer token, the admin token. Other reads
// stay open when no viewer token is set.
func (s *Server) nodeRead(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// One read of the settings decides both the rule and its tokens.
		t := s.tokens()
		kind, query, want := authAdmin, false, settings.SplitTokens(t.Admin)
		if t.Viewer != "" {
			kind, query, want = authViewer, true, readTokens(t)
		}
		if s.checkToken(w, r, kind, query, want...) {
			h(w, r)
		}
	}
}

// nodeNameError refuses a node name outside shared/grammar in a route,
// unless it is a stored record's or the fleet holds something of it: a
// name kept from before the grammar can still be read, rejected and
// released.
func (s *Server) nodeNameError(name string) error {
	err := grammar.NodeName(name)
	if err == nil {
		return nil
	}
	if _, ok := s.opts.Nodes.Get(name); ok || s.fleet.Held(name).Any() {
		return nil
	}
	return err
}

func (s *Server) nodeView(r nodes.Record) view.Node {
	return view.Node{Name: r.Name, State: r.State, Credential: r.CredentialSHA256 != "", Connected: s.hub.connected(r.Name),
		Since: r.Since, LastSeen: r.LastSeen, Hostname: r.Hostname, AgentVersion: r.AgentVersion, Address: r.Address,
		BindApproved: r.BindApproved}
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	state := r.URL.Query().Get("state")
	out := view.Nodes{Nodes: []view.Node{}}
	for _, rec := range s.opts.Nodes.List() {
		if state == "" || rec.State == state {
			out.Nodes = append(out.Nodes, s.nodeView(rec))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) {
	if err := s.nodeNameError(r.PathValue("rest")); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rec, ok := s.opts.Nodes.Get(r.PathValue("rest"))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no node %q", r.PathValue("rest")))
		return
	}
	writeJSON(w, http.StatusOK, s.nodeView(rec))
}

// nodeAction is POST /api/v1/nodes/{name}/approve or .../reject.
func (s *Server) nodeAction(w http.ResponseWriter, r *http.Request) {
	rest := r.PathValue("rest")
	cut := strings.LastIndexByte(rest, '/')
	if cut <= 0 {
		writeError(w, http.StatusNotFound, "no such route: use POST /api/v1/nodes/{name}/approve|reject or DELETE /api/v1/nodes/{name}")
		return
	}
	name, action := rest[:cut], rest[cut+1:]
	if status, msg := drainBody(r.Body); status != 0 {
		writeError(w, status, msg)
		return
	}
	if err := s.nodeNameError(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	before, _ := s.opts.Nodes.Get(name)
	var rec nodes.Record
	var err error
	switch action {
	case "approve":
		rec, err = s.opts.Nodes.Approve(name)
	case "reject":
		rec, err = s.opts.Nodes.Reject(name)
		if err == nil {
			s.hub.kick(name, CloseNodeCredential, "node rejected by an admin", dropNodeRefused)
		}
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route POST .../%s: use POST /api/v1/nodes/{name}/approve|reject", action))
		return
	}
	if err != nil {
		writeError(w, nodeStatus(err), err.Error())
		return
	}
	s.record(r, audit.Entry{Action: action, Target: name, Old: before.State, New: rec.State})
	writeJSON(w, http.StatusOK, s.nodeView(rec))
}

// releaseNode is DELETE /api/v1/nodes/{name}[?forget=workers]: the name
// is forgotten, credential and all, with its workers, their pins,
// decisions, measurements and so their alerts, and its connection closed; the next agent to say
// it enrols as a new node (a reinstalled host that lost its credential).
func (s *Server) releaseNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("rest")
	if status, msg := drainBody(r.Body); status != 0 {
		writeError(w, status, msg)
		return
	}
	if err := s.nodeNameError(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// ?forget=workers is the decommission's explicit form of what a
	// release always does; anything else is refused before any change.
	if f := r.URL.Query()["forget"]; len(f) > 1 || len(f) == 1 && f[0] != "workers" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("forget=%s: the only value is forget=workers (a release always forgets the node's workers)", strings.Join(f, ",")))
		return
	}
	before, _ := s.opts.Nodes.Get(name)
	if err := s.opts.Nodes.Release(name); errors.Is(err, nodes.ErrNotFound) {
		s.releaseRemains(w, r, name)
		return
	} else if err != nil {
		writeError(w, nodeStatus(err), err.Error())
		return
	}
	s.hub.kick(name, CloseNodeCredential, "node name released by an admin; reconnect to enrol", dropNodeRefused)
	s.record(r, audit.Entry{Action: "release", Target: name, Old: before.State, New: "released"})
	// The name's next holder inherits nothing of it: no key, pin, decision
	// or measurement.
	if err := s.fleet.ForgetNode(name); err != nil {
		s.log.Error("node released, but not all it held could be forgotten", "node", name, "error", err)
		writeError(w, http.StatusInternalServerError, "the name is released, but "+err.Error()+"; release it again")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// releasedRemains is the answer to the release of a name with no record
// whose keys, tombs or workers the fleet still held: what was freed.
type releasedRemains struct {
	Node   string     `json:"node"`
	Record bool       `json:"record"`
	Freed  fleet.Held `json:"freed"`
}

// releaseRemains releases what the fleet holds of a name the registry no
// longer knows (a tomb outliving its record): freed and answered 200 with
// what it was, or 404 when nothing is held.
func (s *Server) releaseRemains(w http.ResponseWriter, r *http.Request, name string) {
	held := s.fleet.Held(name)
	if !held.Any() {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%v: %q", nodes.ErrNotFound, name))
		return
	}
	s.record(r, audit.Entry{Action: "release", Target: name, Old: "no record", New: "released"})
	if err := s.fleet.ForgetNode(name); err != nil {
		s.log.Error("could not forget all the fleet held of a node without a record", "node", name, "error", err)
		writeError(w, http.StatusInternalServerError, err.Error()+"; release it again")
		return
	}
	writeJSON(w, http.StatusOK, releasedRemains{Node: name, Freed: held})
}

func nodeStatus(err error) int {
	switch {
	case errors.Is(err, nodes.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, nodes.ErrState):
		return http.StatusConflict
	default:
		return http.StatusInternalServerError
	}
}

// trustCollector exposes the node registry and the bounds on what agents
// send, read at scrape time.
type trustCollector struct {
	s                             *Server
	nodes, keys, fleetNodes       *prometheus.Desc
	claims, evicted, refused, cut *prometheus.Desc
	conns, connsRefused           *prometheus.Desc
}

func newTrustCollector(s *Server) *trustCollector {
	return &trustCollector{s: s,
		nodes:      prometheus.NewDesc("heft_nodes", "Node names the coordinator knows, by enrolment state.", []string{"state"}, nil),
		fleetNodes: prometheus.NewDesc("heft_fleet_nodes", "Nodes the fleet remembers now: connected, or with workers.", nil, nil),
		keys:       prometheus.NewDesc("heft_capacity_keys", "Capacity keys the fleet remembers now: workers and cached measurements.", nil, nil),
		claims: prometheus.NewDesc("heft_capacity_key_claims_refused_total",
			"Engines an agent listed under a capacity key another node owns; refused.", nil, nil),
		evicted: prometheus.NewDesc("heft_capacity_keys_evicted_total",
			"Capacity keys forgotten because their node listed more than max_keys_per_node.", nil, nil),
		refused: prometheus.NewDesc("heft_probe_results_refused_total",
			"Probe results refused: for another node's worker, answering no request, or too late.", nil, nil),
		cut:   prometheus.NewDesc("heft_measurements_cut_total", "Measurements whose texts or lists were cut to what the coordinator keeps.", nil, nil),
		conns: prometheus.NewDesc("heft_connections", "Connections served now, by kind (agent, events, api).", []string{"kind"}, nil),
		connsRefused: prometheus.NewDesc("heft_connections_refused_total",
			"Connections refused with 503 because their kind was at its cap (max_agent_connections, max_event_streams, max_api_requests).", []string{"kind"}, nil),
	}
}

func (c *trustCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodes, c.fleetNodes, c.keys, c.claims, c.evicted, c.refused, c.cut, c.conns, c.connsRefused} {
		ch <- d
	}
}

func (c *trustCollector) Collect(ch chan<- prometheus.Metric) {
	for state, n := range c.s.opts.Nodes.Counts() {
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(n), state)
	}
	st := c.s.fleet.Stats()
	ch <- prometheus.MustNewConstMetric(c.fleetNodes, prometheus.GaugeValue, float64(st.Nodes))
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.CapacityKeys))
	ch <- prometheus.MustNewConstMetric(c.claims, prometheus.CounterValue, float64(st.ClaimsRefused))
	ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(st.KeysEvicted))
	ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.ResultsRefused))
	ch <- prometheus.MustNewConstMetric(c.cut, prometheus.CounterValue, float64(st.MeasurementsCut))
	for kind, cp := range c.s.caps {
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(cp.n.Load()), kind)
		ch <- prometheus.MustNewConstMetric(c.connsRefused, prometheus.CounterValue, float64(cp.refused.Load()), kind)
	}
}
