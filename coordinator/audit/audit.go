// Package audit keeps the coordinator's record of who did what: every
// admin action, with the kind of token and the source address that made
// it, when, and the value before and after. The record is kept in the
// state (a Store), served in pages by GET /api/v1/audit, and written to
// the coordinator's log as each action happens.
package audit

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Entry is one admin action.
type Entry struct {
	Seq    uint64    `json:"seq"`  // 1, 2, ... in the order the actions happened
	Time   time.Time `json:"time"` // when the coordinator applied it
	Token  string    `json:"token"`
	Source string    `json:"source"` // the client's address, as rate limits see it (trusted_proxies)
	// Action is what was done (pin, unpin, admit, hold, probe, approve,
	// reject, release), Target what to: a worker ID or a node name.
	Action string `json:"action"`
	Target string `json:"target"`
	Node   string `json:"node,omitempty"` // a worker's node
	// Old and New describe the target before and after, as the API shows
	// it (a worker's state and pins, a node's enrolment state).
	Old string `json:"old,omitempty"`
	New string `json:"new,omitempty"`
	// Detail says how the target was chosen when one call acted on many
	// (a bulk approval's selector).
	Detail string `json:"detail,omitempty"`
}

// Store keeps entries across restarts; package store implements it,
// keeping at most Max.
type Store interface {
	SaveAudit(e Entry, keep int) error
}

// Max is how many entries the log keeps, in memory and in the state;
// older ones are dropped first.
const Max = 10000

// Log is the audit log. The zero value is not usable; call New.
type Log struct {
	mu      sync.Mutex
	entries []Entry // oldest first, at most max
	next    uint64
	max     int
	store   Store
	log     hclog.Logger
	now     func() time.Time
}

// New returns a log holding the loaded entries (any order), which saves
// new ones to st (nil: memory only).
func New(st Store, loaded []Entry, now func() time.Time, logger hclog.Logger) *Log {
	if now == nil {
		now = time.Now
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	es := slices.Clone(loaded)
	slices.SortFunc(es, func(a, b Entry) int { return cmp.Compare(a.Seq, b.Seq) })
	if len(es) > Max {
		es = es[len(es)-Max:]
	}
	l := &Log{entries: es, next: 1, max: Max, store: st, log: logger.Named("audit"), now: now}
	if n := len(es); n > 0 {
		l.next = es[n-1].Seq + 1
	}
	return l
}

// Record stamps e with its sequence number and time, keeps it, saves it
// and logs it. A store that fails is logged: the action has happened, and
// the entry stays in memory and in the log.
func (l *Log) Record(e Entry) Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq, e.Time = l.next, l.now().UTC()
	l.next++
	l.entries = append(l.entries, e)
	if len(l.entries) > l.max {
		l.entries = slices.Delete(l.entries, 0, len(l.entries)-l.max)
	}
	args := []any{"seq", e.Seq, "action", e.Action, "target", e.Target, "token", e.Token, "source", e.Source}
	if e.Node != "" {
		args = append(args, "node", e.Node)
	}
	if e.Old != "" || e.New != "" {
		args = append(args, "old", e.Old, "new", e.New)
	}
	if e.Detail != "" {
		args = append(args, "detail", e.Detail)
	}
	l.log.Info("admin action", args...)
	if l.store != nil {
		if err := l.store.SaveAudit(e, l.max); err != nil {
			l.log.Error("could not save the audit entry to the state; it is in this log", "seq", e.Seq, "error", err)
		}
	}
	return e
}

// Page returns up to limit entries, newest first, older than before (0:
// from the newest), and the cursor of the next page (0 on the last).
func (l *Log) Page(before uint64, limit int) ([]Entry, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	end := len(l.entries)
	if before > 0 {
		end, _ = slices.BinarySearchFunc(l.entries, before, func(e Entry, s uint64) int { return cmp.Compare(e.Seq, s) })
	}
	start := max(0, end-limit)
	out := make([]Entry, 0, end-start)
	for i := end - 1; i >= start; i-- {
		out = append(out, l.entries[i])
	}
	var next uint64
	if start > 0 {
		next = l.entries[start].Seq
	}
	return out, next
}
