package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/version"
	"heft/shared/wire"
)

// Private close codes (4000–4999) the coordinator sends to agents.
const (
	// CloseSuperseded: a newer connection from the same node took over.
	CloseSuperseded = websocket.StatusCode(wire.CloseSuperseded)
	// CloseProtocolVersion: the agent speaks another protocol version;
	// reconnecting will not help until one side is upgraded.
	CloseProtocolVersion = websocket.StatusCode(wire.CloseProtocolVersion)
	// CloseSlowConsumer: the agent did not read fast enough and its
	// outgoing queue filled.
	CloseSlowConsumer = websocket.StatusCode(wire.CloseSlowConsumer)
	// CloseNodeCredential: the connection may not speak for its node name.
	CloseNodeCredential = websocket.StatusCode(wire.CloseNodeCredential)
	// CloseNodePending: the node awaits an admin's approval.
	CloseNodePending = websocket.StatusCode(wire.CloseNodePending)
	// CloseLimit: a bound on what the coordinator keeps was reached.
	CloseLimit = websocket.StatusCode(wire.CloseLimit)
)

// Labels of heft_agent_disconnects_total.
const (
	dropSuperseded   = "superseded"
	dropVersion      = "protocol_version"
	dropInvalid      = "invalid_message"
	dropNoHello      = "no_hello"
	dropRate         = "rate_exceeded"
	dropTooBig       = "message_too_big"
	dropQueueFull    = "queue_full"
	dropWriteTimeout = "write_timeout"
	dropWriteFailed  = "write_failed"
	dropPingTimeout  = "ping_timeout"
	dropPeerClosed   = "peer_closed"
	dropReadError    = "read_error"
	dropShutdown     = "shutdown"
	dropNodeRefused  = "node_refused"
	dropNodePending  = "node_pending"
	dropLimit        = "limit"
	maxCloseReasonSz = 123 // a close frame's payload is 125 bytes, 2 of them the code
)

var dropReasons = []string{dropSuperseded, dropVersion, dropInvalid, dropNoHello, dropRate, dropTooBig,
	dropQueueFull, dropWriteTimeout, dropWriteFailed, dropPingTimeout, dropPeerClosed, dropReadError, dropShutdown,
	dropNodeRefused, dropNodePending, dropLimit}

// hub owns the agents' websocket connections: at most one per node.
type hub struct {
	s       *Server
	nextID  atomic.Uint64
	helloMu sync.Mutex

	mu      sync.Mutex
	closing bool
	all     map[*agentConn]struct{} // every live connection, hello or not
	byNode  map[string]*agentConn
	serving sync.WaitGroup
}

func newHub(s *Server) *hub {
	return &hub{s: s, all: map[*agentConn]struct{}{}, byNode: map[string]*agentConn{}}
}

// agentConn is one agent's websocket. The handler goroutine reads, and is
// the connection's only long-lived goroutine (at 10,000 agents every
// goroutine's stack counts): a flusher runs only while messages wait in
// the bounded queue, and a ping runs on a timer, each in a goroutine that
// ends when it is done.
type agentConn struct {
	h      *hub
	id     uint64
	source string
	from   netip.Addr // source, parsed; invalid when it is not an address
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	node   string // set once, by the reader, before registration
	// byCredential is the node whose credential, not an agent token,
	// let this connection in; its hello must name that node.
	byCredential string
	// token names the agent token it came with (tokenName), "" with a
	// node credential.
	token string

	qmu      sync.Mutex
	queue    [][]byte // messages waiting for the flusher, oldest first
	flushing bool
	tasks    sync.WaitGroup // the flusher and a ping, while they run
	pinger   *time.Timer    // armed once the hello is accepted
	// credential is the node credential this connection's welcome handed
	// out, until a pong shows the agent read it; wrote says a message
	// (the welcome is the first) was written. A connection that ends
	// before the pong tells the registry the credential was not
	// delivered.
	credential string
	wrote      bool
	// heard counts messages read and handled; busy says the reader is
	// handling one. A ping waits on the reader, which sees the pong only
	// after what came before it: neither an agent whose pong queued
	// behind its own large messages nor a coordinator slow to handle them
	// is a silent peer.
	heard atomic.Uint64
	busy  atomic.Bool

	endOnce sync.Once
	label   string        // why it ended, for the metric; written in endOnce
	closed  chan struct{} // closed once the websocket is closed
}

// end closes the connection once, with a code and a reason for the peer.
// graceful sends a close frame and waits for the answer (bounded by the
// library's 5 s timeouts); otherwise the socket is dropped at once. It
// never blocks the caller.
func (c *agentConn) end(code websocket.StatusCode, reason, label string, graceful bool) {
	c.endOnce.Do(func() {
		c.label = label
		go func() {
			defer close(c.closed)
			if graceful {
				_ = c.ws.Close(code, truncateReason(reason))
			} else {
				_ = c.ws.CloseNow()
			}
		}()
	})
}

// enqueue hands a message to the flusher, starting one if none runs; a
// full queue means the peer is not reading, and it is dropped rather than
// allowed to hold memory.
func (c *agentConn) enqueue(msg []byte) {
	c.qmu.Lock()
	if c.ctx.Err() != nil {
		c.qmu.Unlock()
		return
	}
	if len(c.queue) >= c.h.s.lim.queueSize {
		c.qmu.Unlock()
		c.h.s.log.Warn("agent not reading: outgoing queue full, closing", "node", c.node, "conn", c.id)
		c.end(CloseSlowConsumer, "outgoing queue full: the agent is not reading", dropQueueFull, false)
		return
	}
	c.queue = append(c.queue, msg)
	start := !c.flushing
	if start {
		c.flushing = true
		c.tasks.Add(1)
	}
	c.qmu.Unlock()
	if start {
		go c.flush()
	}
}

// flush writes queued messages, one at a time, until the queue is empty.
func (c *agentConn) flush() {
	defer c.tasks.Done()
	lim := c.h.s.lim
	sent := false
	for {
		c.qmu.Lock()
		c.wrote = c.wrote || sent
		if len(c.queue) == 0 || c.ctx.Err() != nil {
			c.flushing = false
			c.qmu.Unlock()
			return
		}
		msg := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.qmu.Unlock()
		// A deadline on Write's context would close the socket before the
		// reason is recorded; a timer records it first.
		stall := time.AfterFunc(lim.writeTimeout, func() {
			c.end(CloseSlowConsumer, "write timed out", dropWriteTimeout, false)
		})
		err := c.ws.Write(c.ctx, websocket.MessageText, msg)
		stall.Stop()
		if err != nil {
			c.end(websocket.StatusInternalError, "write failed", dropWriteFailed, false)
			c.qmu.Lock()
			c.flushing = false
			c.qmu.Unlock()
			return
		}
		sent = true
	}
}

// pingSoon arms the next ping.
func (c *agentConn) pingSoon() {
	c.pinger = time.AfterFunc(c.h.s.lim.pingEvery, c.pingOnce)
}

// pingOnce runs on the ping timer's own goroutine: it checks the peer
// answers (the reader delivers the pong) and arms the next ping, or ends
// the connection.
func (c *agentConn) pingOnce() {
	c.qmu.Lock()
	if c.ctx.Err() != nil {
		c.qmu.Unlock()
		return
	}
	c.tasks.Add(1)
	wrote := c.wrote
	c.qmu.Unlock()
	defer c.tasks.Done()
	if !c.ping() {
		return
	}
	c.qmu.Lock()
	// The agent reads in order: a pong to a ping sent after the welcome
	// was written means it has read the welcome and kept its credential.
	if cred := c.credential; cred != "" && wrote {
		c.credential = ""
		c.h.s.opts.Nodes.Delivered(c.node, cred, true)
	}
	if c.ctx.Err() == nil { // serve has not stopped the timer for good
		c.pinger.Reset(c.h.s.lim.pingEvery)
	}
	c.qmu.Unlock()
}

func truncateReason(s string) string { return wire.Clip(s, maxCloseReasonSz) }

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byNode)
}

func (h *hub) connected(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.byNode[node]
	return ok
}

// route sends fleet actions to their nodes' agents. An action for a node
// without an agent is dropped: the fleet asks again when it returns.
func (h *hub) route(actions []fleet.Action) {
	for _, a := range actions {
		data, err := wire.Encode(a.Message)
		if err != nil {
			h.s.log.Error("cannot encode a fleet action", "node", a.Node, "type", fmt.Sprintf("%T", a.Message), "error", err)
			continue
		}
		h.mu.Lock()
		c := h.byNode[a.Node]
		h.mu.Unlock()
		if c == nil {
			h.s.log.Debug("no agent for an action; dropped", "node", a.Node, "type", fmt.Sprintf("%T", a.Message))
			continue
		}
		c.enqueue(data)
	}
}

// register makes c the node's connection and returns the one it replaces.
func (h *hub) register(c *agentConn) (old *agentConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old = h.byNode[c.node]
	h.byNode[c.node] = c
	return old
}

// shutdown tells every agent the coordinator is restarting and waits, up
// to timeout, for their connections to finish.
func (h *hub) shutdown(timeout time.Duration) {
	h.mu.Lock()
	h.closing = true
	conns := make([]*agentConn, 0, len(h.all))
	for c := range h.all {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for _, c := range conns {
		c.end(websocket.StatusServiceRestart, "coordinator shutting down", dropShutdown, true)
	}
	done := make(chan struct{})
	go func() { h.serving.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		h.s.log.Warn("agent connections still closing after shutdown timeout", "count", len(conns))
	}
}

// handleAgent is GET /api/v1/agent: authenticate, upgrade, serve.
func (h *hub) handleAgent(w http.ResponseWriter, r *http.Request) {
	s := h.s
	byCredential, token, ok := s.agentAuth(w, r)
	if !ok {
		return
	}
	// Counted here rather than by limitConns: the connection outlives
	// this handler.
	cp := s.caps[connAgent]
	if !cp.take() {
		s.refuseConn(w, r, cp)
		return
	}
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		cp.release()
		writeError(w, http.StatusServiceUnavailable, "coordinator shutting down")
		return
	}
	h.serving.Add(1)
	h.mu.Unlock()

	ws, err := websocket.Accept(smallBuffers{w}, r, nil)
	if err != nil {
		s.log.Debug("websocket upgrade failed", "source", s.clientIP(r), "error", err)
		cp.release()
		h.serving.Done()
		return
	}
	ws.SetReadLimit(wire.MaxMessageBytes)
	// Not r.Context(): the connection outlives the upgrade request.
	ctx, cancel := context.WithCancel(s.base)
	c := &agentConn{
		h: h, id: h.nextID.Add(1), source: s.clientIP(r), ws: ws,
		ctx: ctx, cancel: cancel, closed: make(chan struct{}), byCredential: byCredential, token: token,
	}
	c.from, _ = netip.ParseAddr(c.source)
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if ap, err := netip.ParseAddrPort(la.String()); err == nil {
			s.addrs.serving(ap.Port()) // the port agents dial is the coordinator's own
		}
	}
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		c.end(websocket.StatusServiceRestart, "coordinator shutting down", dropShutdown, true)
		<-c.closed
		cancel()
		cp.release()
		h.serving.Done()
		return
	}
	h.all[c] = struct{}{}
	h.mu.Unlock()
	// The connection is served on a goroutine of its own and this handler
	// returns, so that net/http lets go of the request, the response and
	// the handler chain's stack: at 10,000 agents each of those counts.
	go func() {
		defer h.serving.Done()
		defer cp.release()
		h.serve(c)
	}()
}

// serve runs one connection to its end, then cleans up after it.
func (h *hub) serve(c *agentConn) {
	s := h.s
	log := c.log()
	h.read(c)

	// The reader has stopped; make sure the socket goes too.
	c.end(websocket.StatusInternalError, "connection ended", dropReadError, false)
	h.mu.Lock()
	delete(h.all, c)
	registered := c.node != "" && h.byNode[c.node] == c
	if registered {
		delete(h.byNode, c.node)
	}
	h.mu.Unlock()
	if c.node != "" {
		s.fleet.Disconnect(c.node, c.id)
	}
	s.metrics.disconnects.WithLabelValues(c.label).Inc()
	log.Info("agent disconnected", "node", c.node, "reason", c.label)
	<-c.closed
	c.cancel()
	c.qmu.Lock() // an enqueue or ping that saw the context alive has registered its task
	if c.pinger != nil {
		c.pinger.Stop()
	}
	c.queue = nil
	c.qmu.Unlock()
	c.tasks.Wait()
	if c.credential != "" {
		s.opts.Nodes.Delivered(c.node, c.credential, false)
	}
}

// read is the connection's reader: hello first, then the agent's reports.
// It returns when the connection is over, having called end with the
// reason if the reason is this side's.
func (h *hub) read(c *agentConn) {
	s := h.s
	helloTimer := time.AfterFunc(s.lim.helloTimeout, func() {
		c.end(websocket.StatusPolicyViolation, fmt.Sprintf("no hello within %s", s.lim.helloTimeout), dropNoHello, true)
	})
	defer helloTimer.Stop()
	var rate bucket
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			switch {
			case errors.Is(err, websocket.ErrMessageTooBig):
				// The library has already sent StatusMessageTooBig.
				c.end(websocket.StatusMessageTooBig, "", dropTooBig, false)
			case websocket.CloseStatus(err) != -1:
				c.end(websocket.StatusNormalClosure, "", dropPeerClosed, true)
			default:
				c.end(websocket.StatusInternalError, "", dropReadError, false)
			}
			return
		}
		if !rate.take(time.Now(), s.lim.msgRate, s.lim.msgBurst) {
			c.log().Warn("agent exceeded the message rate, closing", "node", c.node)
			c.end(websocket.StatusPolicyViolation, "message rate exceeded", dropRate, true)
			return
		}
		// Decoding and applying a message takes a deep stack (JSON, the
		// fleet); the reader spends its life waiting in Read with a
		// shallow one. Handled on a goroutine of its own, which ends with
		// the message, the deep stack is not kept once per agent.
		keep := true
		done := make(chan struct{})
		c.heard.Add(1)
		c.busy.Store(true)
		go func() {
			defer close(done)
			keep = h.handle(c, data, helloTimer)
		}()
		<-done
		c.busy.Store(false)
		c.heard.Add(1)
		if !keep {
			return
		}
	}
}

// handle decodes and applies one message from an agent; false ends the
// connection (handle has called end with the reason).
func (h *hub) handle(c *agentConn, data []byte, helloTimer *time.Timer) bool {
	s, log := h.s, c.log()
	env, err := wire.Decode(data)
	if err != nil {
		log.Warn("bad message from agent, closing", "node", c.node, "error", err)
		if errors.Is(err, wire.ErrVersion) {
			msg := strings.TrimPrefix(err.Error(), wire.ErrVersion.Error()+": ")
			c.end(CloseProtocolVersion, "protocol version: "+msg, dropVersion, true)
		} else {
			c.end(websocket.StatusPolicyViolation, err.Error(), dropInvalid, true)
		}
		return false
	}
	s.metrics.messages.WithLabelValues(env.Type).Inc()
	if err := checkGrammar(env); err != nil {
		if env.Type == wire.TypeHello {
			s.metrics.nodeRefusals.WithLabelValues(nodes.LabelName).Inc() // its node name; nothing else of a hello is checked here
		}
		log.Warn("agent sent a string no gateway may be given; closing, nothing stored", "node", c.node, "error", err)
		c.end(websocket.StatusPolicyViolation, err.Error(), dropInvalid, true)
		return false
	}
	if c.node == "" {
		if env.Type != wire.TypeHello {
			c.end(websocket.StatusPolicyViolation, fmt.Sprintf("first message must be hello, got %s", env.Type), dropNoHello, true)
			return false
		}
		helloTimer.Stop()
		return h.hello(c, env.Hello, log)
	}
	if reason := h.dispatch(c, env); reason != "" {
		log.Warn("protocol violation from agent, closing", "node", c.node, "reason", reason)
		c.end(websocket.StatusPolicyViolation, reason, dropInvalid, true)
		return false
	}
	return true
}

// hello decides whether the connection may speak for the node it names
// and, if so, makes it the node's connection. A refused connection is
// closed with a reason and never touches the node's current connection,
// its workers or its measurements; hello then returns false.
func (h *hub) hello(c *agentConn, hello *wire.Hello, log hclog.Logger) bool {
	s := h.s
	if c.byCredential != "" && hello.Node != c.byCredential {
		s.metrics.nodeRefusals.WithLabelValues(nodes.LabelCredential).Inc()
		log.Warn("refusing a hello for another node than the credential's", "node", hello.Node, "credential_of", c.byCredential)
		c.end(CloseNodeCredential, "the hello names another node than the credential", dropNodeRefused, true)
		return false
	}
	d := s.opts.Nodes.Admit(nodes.Hello{Node: hello.Node, Credential: hello.NodeCredential, AgentVersion: hello.AgentVersion,
		Hostname: hello.Host.Hostname, KeepsCredential: hello.KeepsCredential, Address: c.source, Token: c.token})
	welcome, err := wire.Encode(&wire.Welcome{CoordinatorVersion: version.Version, SnapshotSeconds: s.lim.snapshotSeconds,
		NodeCredential: d.Credential})
	if err != nil {
		panic(err) // built from constants and a credential of fixed length; cannot fail
	}
	switch d.Outcome {
	case nodes.Accept:
	case nodes.Pending:
		// Hand the agent its credential before the close, so that it is
		// recognised once approved.
		if d.Credential != "" {
			wctx, cancel := context.WithTimeout(c.ctx, s.lim.writeTimeout)
			err := c.ws.Write(wctx, websocket.MessageText, welcome)
			cancel()
			s.opts.Nodes.Delivered(hello.Node, d.Credential, err == nil)
		}
		s.metrics.nodeRefusals.WithLabelValues(d.Label).Inc()
		log.Info("node awaits approval; closing", "node", hello.Node, "reason", d.Reason)
		c.end(CloseNodePending, d.Close, dropNodePending, true)
		return false
	case nodes.Limit:
		s.metrics.nodeRefusals.WithLabelValues(d.Label).Inc()
		log.Warn("refusing a new node", "node", hello.Node, "reason", d.Reason)
		c.end(CloseLimit, d.Close, dropLimit, true)
		return false
	default:
		s.metrics.nodeRefusals.WithLabelValues(d.Label).Inc()
		log.Warn("refusing a connection for a node name", "node", hello.Node, "reason", d.Reason)
		c.end(CloseNodeCredential, d.Close, dropNodeRefused, true)
		return false
	}
	// Registration and Connect happen in one order for racing connections
	// of a node, so the hub and the fleet agree on which one is current.
	// The welcome is queued inside that order too: an agent that opens
	// another connection once it has read it (a restart) finds this one
	// registered, and supersedes it rather than being superseded by it.
	hello.Measurements = offerable(hello.Measurements, log) // outside the lock every hello waits on
	h.helloMu.Lock()
	c.enqueue(welcome) // first, before any action the fleet sends
	c.node = hello.Node
	// No ping before now: the reader, which takes the pong, waits while
	// the hello is decided, and a ping would end a connection whose
	// enrolment is slow to store, losing the credential it was handed.
	c.qmu.Lock()
	c.credential = d.Credential
	c.pingSoon()
	c.qmu.Unlock()
	old := h.register(c)
	actions := s.fleet.Connect(c.node, c.id, *hello)
	h.helloMu.Unlock()
	log.Info("agent connected", "node", c.node, "agent_version", hello.AgentVersion, "enrolled", d.Credential != "")
	// A reject or release stores the record, then closes the node's
	// registered connection. One that came between Admit and register
	// found nothing to close, so ask again now that c is registered: one
	// of the two always sees the other.
	if !s.opts.Nodes.Admitted(c.node) {
		log.Info("node rejected or released while its connection was admitted; closing", "node", c.node)
		c.end(CloseNodeCredential, "node rejected or released by an admin", dropNodeRefused, true)
		if old != nil {
			old.end(CloseNodeCredential, "node rejected or released by an admin", dropNodeRefused, true)
		}
		return false
	}
	h.route(actions)
	if old != nil {
		log.Info("closing the older connection of this node", "node", c.node, "old_conn", old.id)
		old.end(CloseSuperseded, "superseded by a newer connection from this node", dropSuperseded, true)
	}
	return true
}

// log is the connection's logger, made when there is something to log:
// one kept per connection would cost every agent its fields.
func (c *agentConn) log() hclog.Logger {
	return c.h.s.log.With("conn", c.id, "source", c.source)
}

// kick closes a node's connection, if it has one, for an admin's action
// on its name.
func (h *hub) kick(node string, code websocket.StatusCode, reason, label string) {
	h.mu.Lock()
	c := h.byNode[node]
	h.mu.Unlock()
	if c != nil {
		c.end(code, reason, label, true)
	}
}

// dispatch hands one report to the fleet; a non-empty result is a reason
// to close the connection.
func (h *hub) dispatch(c *agentConn, env *wire.Envelope) string {
	f := h.s.fleet
	switch env.Type {
	case wire.TypeSnapshot:
		if env.Snapshot.Node != c.node {
			return fmt.Sprintf("snapshot.node %q differs from hello.node %q", env.Snapshot.Node, c.node)
		}
		f.SetAddressRefusals(c.node, h.s.addrs.refusals(c.node, c.from, env.Snapshot.Engines))
		h.route(f.Snapshot(c.node, *env.Snapshot))
	case wire.TypeProbeResult:
		actions, err := f.ProbeResult(c.node, *env.ProbeResult)
		if err != nil {
			// A result for a worker the fleet no longer wants is not worth a
			// reconnect; the fleet has refused it and that is enough.
			h.s.log.Warn("probe result refused", "node", c.node, "capacity_key",
				env.ProbeResult.Measurement.CapacityKey, "error", err)
		}
		h.route(actions)
	case wire.TypeProbeStatus:
		h.route(f.ProbeStatus(c.node, *env.ProbeStatus))
	case wire.TypeHello:
		return "hello sent twice"
	default:
		return fmt.Sprintf("unexpected message type %s from an agent", env.Type)
	}
	return ""
}

// ping checks the peer answers (the reader delivers the pong); false ends
// the connection.
func (c *agentConn) ping() bool {
	lim := c.h.s.lim
	// The pong is late only if nothing else came either: while messages
	// still arrive or one is being handled, the wait goes on.
	var (
		mu    sync.Mutex // guards late and over against the timer's callback
		late  *time.Timer
		over  bool // the ping has returned: the callback must do nothing
		heard = c.heard.Load()
	)
	mu.Lock()
	late = time.AfterFunc(lim.pingTimeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if over {
			return
		}
		if now := c.heard.Load(); now != heard || c.busy.Load() {
			heard = now
			late.Reset(lim.pingTimeout)
			return
		}
		c.end(websocket.StatusGoingAway, "ping timeout", dropPingTimeout, false)
	})
	mu.Unlock()
	err := c.ws.Ping(c.ctx)
	mu.Lock()
	over = true
	late.Stop()
	mu.Unlock()
	if err != nil {
		c.end(websocket.StatusGoingAway, "ping failed", dropPingTimeout, false)
		return false
	}
	return true
}
