package link

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/coder/websocket"

	"heft/agent/status"
	"heft/shared/wire"
)

// AgentPath is the coordinator's agent endpoint.
const AgentPath = "/api/v1/agent"

// Reasons the link is down, as the status board and its log lines say.
const (
	ReasonUnreachable = "unreachable"  // nothing answered the dial
	ReasonRefused     = "refused"      // the coordinator answered and said no
	ReasonNotEndpoint = "not_endpoint" // the URL answered, but not as the agent endpoint
	ReasonVersion     = "version"      // the two sides speak different protocol versions
	ReasonSuperseded  = "superseded"   // another agent connected with this node name
	ReasonPending     = "pending"      // the node awaits an admin's approval
	ReasonLost        = "lost"         // a working link ended
)

// welcomed marks the link up: the coordinator accepted the hello.
func (l *link) welcomed(w *wire.Welcome) {
	l.log.Debug("welcomed by coordinator", "coordinator_version", w.CoordinatorVersion, "snapshot_seconds", w.SnapshotSeconds)
	if !l.rep.OK(l.cfg.URL, "connected to coordinator again", "coordinator_version", w.CoordinatorVersion) {
		l.log.Info("connected to coordinator", "url", l.cfg.URL, "coordinator_version", w.CoordinatorVersion)
	}
}

// failure says what a session's end means to an operator: what to fix
// where the coordinator refused the agent (at error level, since waiting
// cannot mend it), a warning where it could not be reached or the link
// dropped.
func (l *link) failure(err error) status.Failure {
	f := status.Failure{Err: fmt.Sprint(err)}
	var refused *refusedError
	var redirect *redirectError
	var closed websocket.CloseError
	switch {
	case errors.As(err, &redirect):
		f.Reason, f.Error = ReasonNotEndpoint, true
		f.Msg = "coordinator URL redirects elsewhere; not followed, so the credentials stay here: set coordinator.url to the final URL"
		f.Args = []any{"redirect_to", redirect.to}
	case errors.As(err, &refused):
		f.Error = true
		switch refused.status {
		case http.StatusUnauthorized:
			f.Reason, f.Msg = ReasonRefused, "coordinator rejected the agent token (401); check token or token_file"
		case http.StatusForbidden:
			f.Reason, f.Msg = ReasonRefused, "coordinator refused this agent (403)"
		case http.StatusTooManyRequests:
			f.Reason, f.Msg = ReasonRefused, "coordinator refuses this address for now after failed logins (429)"
		default:
			f.Reason = ReasonNotEndpoint
			f.Msg = fmt.Sprintf("coordinator URL answered %d, not a websocket: it must be the coordinator's agent endpoint", refused.status)
			f.Args = []any{"hint", "write ws://HOST:PORT" + AgentPath + " (wss:// with TLS)"}
		}
	case errors.As(err, &closed) && closed.Code == wire.CloseProtocolVersion:
		f.Reason, f.Msg, f.Error = ReasonVersion, "coordinator refused this agent's protocol version; upgrade the older of the two", true
	case errors.As(err, &closed) && closed.Code == wire.CloseSuperseded:
		f.Reason, f.Msg, f.Error = ReasonSuperseded, "another agent connected with this node name and replaced this one; give each agent its own [node] name", true
	case errors.As(err, &closed) && closed.Code == wire.CloseNodeCredential:
		f.Reason, f.Msg, f.Error = ReasonRefused, "coordinator refused this node name's credential: if this host was reinstalled or lost its state_dir, "+
			"an admin releases the name (DELETE /api/v1/nodes/NAME on the coordinator)", true
		f.Args = []any{"node", l.cfg.Node}
	case errors.As(err, &closed) && closed.Code == wire.CloseNodePending:
		f.Reason, f.Msg = ReasonPending, "this node awaits an admin's approval on the coordinator (POST /api/v1/nodes/NAME/approve); retrying"
		f.Args = []any{"node", l.cfg.Node}
	case errors.As(err, &closed) && closed.Code >= 4000 && closed.Code != wire.CloseSlowConsumer:
		// heft's other refusals (a node credential that does not match).
		f.Reason, f.Msg, f.Error = ReasonRefused, "coordinator refused this agent", true
	case errors.As(err, new(*dialError)):
		f.Reason, f.Msg = ReasonUnreachable, "coordinator unreachable; retrying"
	default:
		f.Reason, f.Msg = ReasonLost, "link to coordinator lost; reconnecting"
	}
	return f
}

// dialError is a dial that got no HTTP answer at all.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// redirectError is a dial the coordinator URL answered with a redirect,
// which the link does not follow.
type redirectError struct {
	status int
	to     string
}

func (e *redirectError) Error() string {
	return fmt.Sprintf("coordinator URL redirected (%d) to %s; not followed: set coordinator.url to the final URL", e.status, e.to)
}
