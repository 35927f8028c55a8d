// Package nodes decides which agent connections may speak for a node name.
//
// The agent token only enrols. The first connection of a node name is
// handed a node credential (32 random bytes), of which the coordinator
// keeps only a SHA-256 hash; every later connection for that name must
// present it in its hello, or it is refused without disturbing the node's
// connection, its workers or its measurements. With approve_new_nodes a
// new name waits, pending, until an admin approves it. An admin can
// reject a name, and release one (a reinstalled host that lost its
// credential then enrols again).
//
// Names known from before credentials existed, and agents too old to keep
// a credential, are "unbound": accepted by name, as before. A newer agent
// binds an unbound name on its next connection (trust on first use), and
// require_node_credential refuses agents that cannot keep one.
//
// The registry is bounded: at most MaxNodes records, of which at most
// MaxPending pending (past which a new name is refused, never one waiting
// forgotten), and a node
// not seen for ForgetAfter is forgotten, credential and all.
//
// A node name follows shared/grammar (grammar.NodeName); any other name is
// refused at Admit. A record stored under a name from before that rule is
// loaded as it is: listed, counted, readable and releasable by an admin,
// but no connection is admitted under it, so it is forgotten ForgetAfter
// after it was last seen, as any node that stays away.
package nodes

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/grammar"
	"heft/shared/wire"
)

// States of a node record.
const (
	// StateEnrolled: the node holds a credential and is admitted.
	StateEnrolled = "enrolled"
	// StateUnbound: admitted by name alone: known before node credentials,
	// or its agent cannot keep one.
	StateUnbound = "unbound"
	// StatePending: waiting for an admin's approval (approve_new_nodes).
	StatePending = "pending"
	// StateRejected: refused by an admin until the name is released.
	StateRejected = "rejected"
	// StateDamaged: its stored record could not be read. The name stays
	// bound, refusing every connection, until an admin releases it: a
	// damaged record must not free a name for whoever says it first.
	StateDamaged = "damaged"
)

// Record is what the coordinator keeps about one node name. Its JSON form
// is what the store writes.
type Record struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// CredentialSHA256 is the hex SHA-256 of the node's credential; empty
	// for an unbound node.
	CredentialSHA256 string    `json:"credential_sha256,omitempty"`
	Since            time.Time `json:"since"` // when it entered its state
	LastSeen         time.Time `json:"last_seen"`
	// What the last connection said and where it came from, for an admin
	// deciding on a pending node.
	Hostname     string `json:"hostname,omitempty"`
	AgentVersion string `json:"agent_version,omitempty"`
	Address      string `json:"address,omitempty"`
	// An unbound name is bound to a credential only from BindFrom, the
	// address it enrolled from, or once an admin approved the bind
	// (bind.go): never by whoever asks first.
	BindFrom     string `json:"bind_from,omitempty"`
	BindApproved bool   `json:"bind_approved,omitempty"`
}

// Store keeps the records; package store implements it.
type Store interface {
	SaveNode(r Record) error
	DeleteNode(name string) error
}

// Config bounds and shapes the registry.
type Config struct {
	// ApproveNew makes a new name wait for an admin's approval.
	ApproveNew bool
	// RequireCredential refuses agents that cannot keep a credential,
	// instead of admitting them unbound.
	RequireCredential bool
	MaxNodes          int           // records of every state
	MaxPending        int           // pending records among them
	ForgetAfter       time.Duration // a node unseen this long is forgotten
	// NewPerToken and NewPerAddress bound the new names a minute enrolled
	// with one agent token and from one source address (ratelimit.go); 0
	// is no bound. Known names reconnecting are never limited.
	NewPerToken   int
	NewPerAddress int
}

// Defaults.
const (
	DefaultMaxNodes    = 50000
	DefaultMaxPending  = 1000
	DefaultForgetAfter = 30 * 24 * time.Hour
	// Twenty and more hosts starting at once enrol within the minute; a
	// loop inventing names does not grow the state by more.
	DefaultNewPerToken   = 200
	DefaultNewPerAddress = 30
)

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{MaxNodes: DefaultMaxNodes, MaxPending: DefaultMaxPending, ForgetAfter: DefaultForgetAfter,
		NewPerToken: DefaultNewPerToken, NewPerAddress: DefaultNewPerAddress}
}

// Validate checks the bounds.
func (c Config) Validate() error {
	var errs []error
	if c.MaxNodes < 1 {
		errs = append(errs, fmt.Errorf("max_nodes must be at least 1, is %d", c.MaxNodes))
	}
	if c.MaxPending < 1 || c.MaxPending > c.MaxNodes {
		errs = append(errs, fmt.Errorf("max_pending_nodes must be within [1, max_nodes], is %d", c.MaxPending))
	}
	if c.ForgetAfter <= 0 {
		errs = append(errs, fmt.Errorf("forget_nodes_after must be above zero, is %s", c.ForgetAfter))
	}
	if c.NewPerToken < 0 || c.NewPerAddress < 0 {
		errs = append(errs, fmt.Errorf("new_nodes_per_minute_per_token and new_nodes_per_minute_per_address must be 0 (no bound) or above, are %d and %d",
			c.NewPerToken, c.NewPerAddress))
	}
	return errors.Join(errs...)
}

// Outcomes of Admit.
const (
	Accept  = "accept"  // serve the connection
	Pending = "pending" // hand it its credential, then close: it waits for approval
	Refuse  = "refuse"  // close it: Reason says why
	Limit   = "limit"   // close it: the registry is full
)

// Decision is what to do with a connection's hello.
type Decision struct {
	Outcome string
	// Credential, when set, is a new credential the agent must keep and
	// present from now on (it goes in the Welcome).
	Credential string
	// Reason says why, in full, for the log; Close is its short form for
	// the websocket close frame (at most 123 bytes).
	Reason, Close string
	// Label names the refusal for metrics: credential, rejected, pending,
	// old_agent, limit, busy, store.
	Label string
}

// Labels of Decision.Label.
const (
	LabelCredential = "credential"
	LabelRejected   = "rejected"
	LabelPending    = "pending"
	LabelOldAgent   = "old_agent"
	LabelLimit      = "limit"
	LabelBusy       = "busy"
	LabelStore      = "store"
	LabelDamaged    = "damaged"
	LabelRate       = "rate"
	LabelName       = "name" // outside grammar.NodeName
)

// Labels lists every refusal label.
var Labels = []string{LabelCredential, LabelRejected, LabelPending, LabelOldAgent, LabelLimit, LabelBusy, LabelStore, LabelDamaged, LabelRate, LabelName}

// Errors of the admin actions.
var (
	ErrNotFound = errors.New("no such node")
	ErrState    = errors.New("the node is not in a state that allows this")
)

// Registry is the set of node records. It is safe for concurrent use.
type Registry struct {
	cfg Config
	st  Store
	now func() time.Time
	log hclog.Logger

	mu        sync.Mutex
	nodes     map[string]*Record
	enrolling map[string]bool    // names whose new record is being written
	handed    map[string]handout // credentials handed out, not yet known to have reached their agent
	// enrollingPending counts the new pending names among enrolling.
	enrollingPending int
	savedSeen        map[string]time.Time // the last-seen time each stored record holds
	lastTick         time.Time
	rates            rates // new names a minute (ratelimit.go)
}

// New builds a registry over the records a store loaded.
func New(cfg Config, st Store, records map[string]Record, now func() time.Time, logger hclog.Logger) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("nodes: no store")
	}
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	r := &Registry{cfg: cfg, st: st, now: now, log: logger.Named("nodes"), nodes: map[string]*Record{}, enrolling: map[string]bool{},
		handed: map[string]handout{}, savedSeen: map[string]time.Time{}}
	for name, rec := range records {
		if err := check(rec); err != nil || rec.Name != name {
			if (&wire.Hello{Node: name}).Validate() != nil {
				r.log.Warn("ignoring a stored node record under a name no agent can say", "node", name, "error", err)
				continue
			}
			// Fail closed: the name stays bound until an admin acts.
			r.log.Warn("a stored node record is damaged: its name refuses every connection until an admin releases it", "node", name, "error", err)
			rec = Record{Name: name, State: StateDamaged}
		}
		if err := grammar.NodeName(name); err != nil {
			r.log.Warn("a stored node record's name is outside the node name grammar: no agent can connect under it; "+
				"it is forgotten after forget_nodes_after unseen, or an admin releases it now", "node", name, "error", err)
		}
		rec := rec
		r.nodes[name] = &rec
		r.savedSeen[name] = rec.LastSeen
	}
	return r, nil
}

func check(r Record) error {
	if err := (&wire.Hello{Node: r.Name}).Validate(); err != nil {
		return err
	}
	switch r.State {
	case StateEnrolled, StatePending, StateRejected:
		if r.State != StateRejected && len(r.CredentialSHA256) != sha256.Size*2 && r.CredentialSHA256 != "" {
			return fmt.Errorf("credential hash of %d characters", len(r.CredentialSHA256))
		}
	case StateUnbound, StateDamaged:
	default:
		return fmt.Errorf("unknown state %q", r.State)
	}
	return nil
}

// Hello is what Admit needs of a connection.
type Hello struct {
	Node, Credential, AgentVersion, Hostname string
	// KeepsCredential is true for an agent that stores the credential it
	// is handed; older agents do not.
	KeepsCredential bool
	Address         string
	// Token names the agent token the connection came with (never the
	// token itself); "" when it came with a node credential.
	Token string
}

// NewCredential returns 32 random bytes, URL-safe base64.
func NewCredential() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hash(cred string) string {
	h := sha256.Sum256([]byte(cred))
	return hex.EncodeToString(h[:])
}

// matches compares a presented credential with a stored hash in constant time.
func matches(cred, stored string) bool {
	if cred == "" || stored == "" {
		return false
	}
	got := hash(cred)
	return subtle.ConstantTimeCompare([]byte(got), []byte(stored)) == 1
}

// Admit decides what a connection that said h may do. A new record (or a
// new credential) is written to the store before the decision is returned,
// so a credential handed out survives a crash.
func (r *Registry) Admit(h Hello) Decision {
	if err := grammar.NodeName(h.Node); err != nil {
		return Decision{Outcome: Refuse, Label: LabelName, Close: "node name outside heft's grammar (ASCII letters, digits, . _ -, not starting with . or -); set [node] name",
			Reason: err.Error() + "; set the agent's [node] name (or HEFT_NODE, --node) to one"}
	}
	now := r.now()
	r.mu.Lock()
	rec, known := r.nodes[h.Node]
	var next Record
	var d Decision
	var final bool
	if known {
		next, d, final = r.decideKnown(rec, h, now)
	} else {
		next, d, final = r.decideNew(h, now)
	}
	if final {
		r.mu.Unlock()
		return d
	}
	return r.write(h, next, d, rec, now) // unlocks
}

// decideKnown decides for a name the registry holds. Final decisions
// need no write; otherwise next is the record to store. The caller holds
// mu.
func (r *Registry) decideKnown(rec *Record, h Hello, now time.Time) (next Record, d Decision, final bool) {
	switch {
	case rec.State == StateDamaged:
		return next, Decision{Outcome: Refuse, Label: LabelDamaged, Close: "the coordinator's record of this node is damaged; an admin can release the name",
			Reason: fmt.Sprintf("the coordinator's stored record of node %q is damaged, so it cannot check this connection's credential; "+
				"an admin releases the name (DELETE /api/v1/nodes/%s) and its agent enrols again", h.Node, h.Node)}, true
	case rec.State == StateRejected:
		return next, Decision{Outcome: Refuse, Label: LabelRejected, Close: "node rejected by an admin",
			Reason: fmt.Sprintf("node name %q was rejected by an admin; an admin can release it (DELETE /api/v1/nodes/%s)", h.Node, h.Node)}, true
	case rec.CredentialSHA256 != "":
		if !matches(h.Credential, rec.CredentialSHA256) {
			what := "without its credential"
			if h.Credential != "" {
				what = "with a credential that is not its own"
			}
			return next, Decision{Outcome: Refuse, Label: LabelCredential, Close: "node credential missing or wrong; an admin can release the name",
				Reason: fmt.Sprintf("node name %q is enrolled and this connection came %s; "+
					"if the host was reinstalled, an admin releases the name (DELETE /api/v1/nodes/%s)", h.Node, what, h.Node)}, true
		}
		r.seen(rec, h, now)
		delete(r.handed, h.Node) // presented, so it was delivered
		if rec.State == StatePending {
			return next, pending(h.Node, ""), true
		}
		return next, Decision{Outcome: Accept}, true
	case rec.State == StatePending: // unbound and pending
		r.seen(rec, h, now)
		if !h.KeepsCredential {
			return next, pending(h.Node, ""), true
		}
		return *rec, pending(h.Node, NewCredential()), false
	}
	// Unbound and admitted: known by name alone.
	if !h.KeepsCredential && r.cfg.RequireCredential {
		return next, oldAgent(h.Node), true
	}
	if !h.KeepsCredential || !r.mayBind(rec, h) {
		r.seen(rec, h, now)
		return next, Decision{Outcome: Accept}, true
	}
	next = *rec
	next.State, next.Since, next.BindFrom, next.BindApproved = StateEnrolled, now, "", false
	r.log.Info("binding an unbound node name to a credential", "node", h.Node, "address", h.Address)
	return next, Decision{Outcome: Accept, Credential: NewCredential()}, false
}

// decideNew decides for a name the registry does not hold. The caller
// holds mu.
func (r *Registry) decideNew(h Hello, now time.Time) (next Record, d Decision, final bool) {
	if !h.KeepsCredential && r.cfg.RequireCredential {
		return next, oldAgent(h.Node), true
	}
	if len(r.nodes)+len(r.enrolling) >= r.cfg.MaxNodes {
		return next, Decision{Outcome: Limit, Label: LabelLimit, Close: "the coordinator holds max_nodes node records",
			Reason: fmt.Sprintf("the coordinator holds its limit of %d node records (max_nodes); an admin can release unused names", r.cfg.MaxNodes)}, true
	}
	if d, limited := r.rateLimited(h, now); limited {
		return next, d, true
	}
	next = Record{Name: h.Node, State: StateUnbound, Since: now}
	d = Decision{Outcome: Accept}
	if h.KeepsCredential {
		next.State, d.Credential = StateEnrolled, NewCredential()
	} else {
		next.BindFrom = clip(h.Address) // where it may later bind from without an admin
	}
	if r.cfg.ApproveNew {
		next.State, d = StatePending, pending(h.Node, d.Credential)
	}
	return next, d, false
}

// write stores next, the record a decision d needs, and returns d, or a
// refusal when it cannot. rec is the record it replaces (nil for a new
// name). The caller holds mu; write releases it while the store writes.
func (r *Registry) write(h Hello, next Record, d Decision, rec *Record, now time.Time) Decision {
	known := rec != nil
	if r.enrolling[h.Node] {
		r.mu.Unlock()
		return Decision{Outcome: Refuse, Label: LabelBusy, Close: "another connection of this node is enrolling; retry",
			Reason: fmt.Sprintf("another connection of node %q is enrolling at this moment", h.Node)}
	}
	if d.Credential != "" {
		next.CredentialSHA256 = hash(d.Credential)
	}
	next.LastSeen, next.Hostname, next.AgentVersion, next.Address = now, clip(h.Hostname), clip(h.AgentVersion), clip(h.Address)
	// A new waiting name counts against max_pending_nodes from here, while
	// its record is written, so that concurrent enrolments cannot pass the
	// cap together; and a full list refuses it rather than forget a name
	// already waiting, which a flood of new names would otherwise push out.
	newPending := next.State == StatePending && !known
	if newPending {
		if r.pendingCount()+r.enrollingPending >= r.cfg.MaxPending {
			r.mu.Unlock()
			return Decision{Outcome: Limit, Label: LabelLimit, Close: "the coordinator holds max_pending_nodes waiting names",
				Reason: fmt.Sprintf("%d node names await approval (max_pending_nodes); an admin approves, rejects or releases them", r.cfg.MaxPending)}
		}
		r.enrollingPending++
	}
	r.enrolling[h.Node] = true
	var before *Record // what Delivered(false) restores
	if known {
		before = new(*rec)
	}
	r.mu.Unlock()

	err := r.st.SaveNode(next)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.enrolling, h.Node)
	if newPending {
		r.enrollingPending--
	}
	if err != nil {
		r.log.Error("could not store a node record; refusing the connection", "node", h.Node, "error", err)
		return Decision{Outcome: Refuse, Label: LabelStore, Close: "the coordinator could not store this node's record; retry later",
			Reason: "the coordinator could not store this node's record: " + err.Error()}
	}
	r.nodes[h.Node] = &next
	r.savedSeen[h.Node] = next.LastSeen
	if d.Credential != "" {
		r.handed[h.Node] = handout{hash: next.CredentialSHA256, before: before}
	}
	if !known {
		r.log.Info("new node", "node", h.Node, "state", next.State, "address", h.Address, "agent_version", h.AgentVersion)
	}
	return d
}

func pending(node, credential string) Decision {
	return Decision{Outcome: Pending, Credential: credential, Label: LabelPending, Close: "node awaits an admin's approval",
		Reason: fmt.Sprintf("node %q awaits an admin's approval (POST /api/v1/nodes/%s/approve)", node, node)}
}

func oldAgent(node string) Decision {
	return Decision{Outcome: Refuse, Label: LabelOldAgent, Close: "this heft-agent cannot keep a node credential; upgrade it",
		Reason: fmt.Sprintf("node %q: this heft-agent cannot keep a node credential and require_node_credential is set; upgrade heft-agent", node)}
}

// seen notes a connection of a known node in memory; Tick writes it.
func (r *Registry) seen(rec *Record, h Hello, now time.Time) {
	rec.LastSeen = now
	rec.Hostname, rec.AgentVersion, rec.Address = clip(h.Hostname), clip(h.AgentVersion), clip(h.Address)
}

// pendingCount is how many stored records wait for approval; the caller
// holds mu.
func (r *Registry) pendingCount() int {
	n := 0
	for _, rec := range r.nodes {
		if rec.State == StatePending {
			n++
		}
	}
	return n
}

func clip(s string) string { return wire.Clip(s, 253) }

// forget deletes a record from the store and memory.
func (r *Registry) forget(name, why string) {
	if err := r.st.DeleteNode(name); err != nil {
		r.log.Warn("could not delete a node record", "node", name, "error", err)
		return
	}
	r.mu.Lock()
	delete(r.nodes, name)
	delete(r.savedSeen, name)
	r.mu.Unlock()
	r.log.Info("node record forgotten", "node", name, "why", why)
}

// Approve admits a pending node. For an unbound node it approves the
// bind: the next connection of it whose agent keeps a credential binds
// the name, wherever it comes from (bind.go).
func (r *Registry) Approve(name string) (Record, error) {
	return r.change(name, func(rec *Record) error {
		if rec.State == StateUnbound {
			rec.BindApproved = true
			return nil
		}
		if rec.State != StatePending {
			return fmt.Errorf("%w: node %q is %s, not pending", ErrState, name, rec.State)
		}
		rec.State = StateEnrolled
		if rec.CredentialSHA256 == "" {
			rec.State = StateUnbound // its agent keeps no credential
		}
		return nil
	})
}

// Reject refuses a node's connections until its name is released. A
// connected node should be disconnected by the caller.
func (r *Registry) Reject(name string) (Record, error) {
	return r.change(name, func(rec *Record) error {
		if rec.State == StateRejected {
			return nil
		}
		rec.State, rec.CredentialSHA256 = StateRejected, ""
		return nil
	})
}

func (r *Registry) change(name string, f func(*Record) error) (Record, error) {
	r.mu.Lock()
	rec, ok := r.nodes[name]
	if !ok {
		r.mu.Unlock()
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	next := *rec
	if err := f(&next); err != nil {
		r.mu.Unlock()
		return Record{}, err
	}
	next.Since = r.now()
	r.mu.Unlock()
	if err := r.st.SaveNode(next); err != nil {
		return Record{}, fmt.Errorf("nodes: store %q: %w", name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.nodes[name]; ok {
		next.LastSeen = cur.LastSeen
	}
	r.nodes[name] = &next
	r.savedSeen[name] = next.LastSeen
	r.log.Info("node record changed by an admin", "node", name, "state", next.State)
	return next, nil
}

// Release forgets a name, credential and all: the next connection that
// says it enrols as a new node. A connected node should be disconnected
// by the caller.
func (r *Registry) Release(name string) error {
	r.mu.Lock()
	_, ok := r.nodes[name]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err := r.st.DeleteNode(name); err != nil {
		return fmt.Errorf("nodes: release %q: %w", name, err)
	}
	r.mu.Lock()
	delete(r.nodes, name)
	delete(r.savedSeen, name)
	r.mu.Unlock()
	r.log.Info("node name released by an admin", "node", name)
	return nil
}

// Get returns one record.
func (r *Registry) Get(name string) (Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.nodes[name]
	if !ok {
		return Record{}, false
	}
	return *rec, true
}

// List returns every record, sorted by name.
func (r *Registry) List() []Record {
	r.mu.Lock()
	out := make([]Record, 0, len(r.nodes))
	for _, rec := range r.nodes {
		out = append(out, *rec)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Counts returns the number of records in each state.
func (r *Registry) Counts() map[string]int {
	out := map[string]int{StateEnrolled: 0, StateUnbound: 0, StatePending: 0, StateRejected: 0, StateDamaged: 0}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.nodes {
		out[rec.State]++
	}
	return out
}

// persistEvery is how stale a stored last-seen time may get: it only has
// to be right to within this for ForgetAfter.
const persistEvery = time.Hour

// tickEvery is how often Tick does its work; more often is a no-op.
const tickEvery = time.Minute

// Tick forgets the nodes unseen for ForgetAfter (connected reports the
// ones connected now, which count as seen now) and writes last-seen times
// that drifted from the stored ones by persistEvery. It writes outside
// the lock. Before a name's record goes, release forgets what the rest
// of the coordinator holds of it (fleet.ForgetNode: its keys, pins,
// decisions and measurements), as an admin's release does; when that
// fails the record stays, and the next Tick tries again, so the name is
// never free while something of it could be inherited.
func (r *Registry) Tick(connected func(name string) bool, release func(name string) error) {
	now := r.now()
	var old, touch []Record
	r.mu.Lock()
	if now.Sub(r.lastTick) < tickEvery {
		r.mu.Unlock()
		return
	}
	r.lastTick = now
	for _, rec := range r.nodes {
		if connected(rec.Name) {
			rec.LastSeen = now
		}
		switch {
		case rec.State == StateDamaged: // kept until an admin acts
		case now.Sub(rec.LastSeen) >= r.cfg.ForgetAfter:
			old = append(old, *rec)
		case rec.LastSeen.Sub(r.savedSeen[rec.Name]) >= persistEvery:
			touch = append(touch, *rec)
		}
	}
	r.mu.Unlock()
	for _, rec := range old {
		if connected(rec.Name) {
			continue // it came back meanwhile
		}
		if release != nil {
			if err := release(rec.Name); err != nil {
				r.log.Warn("could not forget what a node unseen past forget_nodes_after held; keeping its name until it can", "node", rec.Name, "error", err)
				continue
			}
		}
		r.forget(rec.Name, fmt.Sprintf("not seen since %s (forget_nodes_after %s)", rec.LastSeen.UTC().Format(time.RFC3339), r.cfg.ForgetAfter))
	}
	for _, rec := range touch {
		if err := r.st.SaveNode(rec); err != nil {
			r.log.Warn("could not store a node's last-seen time", "node", rec.Name, "error", err)
			continue
		}
		r.mu.Lock()
		if _, ok := r.nodes[rec.Name]; ok {
			r.savedSeen[rec.Name] = rec.LastSeen
		}
		r.mu.Unlock()
	}
}

// Memory is a Store that keeps nothing: for a coordinator without state
// (tests) and for servers built without a registry.
type Memory struct{}

// SaveNode implements Store.
func (Memory) SaveNode(Record) error { return nil }

// DeleteNode implements Store.
func (Memory) DeleteNode(string) error { return nil }
