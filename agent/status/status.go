// Package status keeps what the agent knows to be failing now: the link
// to the coordinator, each engine, each engine's log, each engine's last
// probe. Every part reports through a Reporter, and the Board writes one
// log line per change (when a thing starts failing, when the reason
// changes, and when it recovers), never one per poll, so that the agent's
// own journal says what the coordinator sees. /healthz and the metrics
// read the same Board.
package status

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Areas: what a thing on the Board is.
const (
	AreaCoordinator = "coordinator" // the link; its name is the coordinator URL
	AreaEngine      = "engine"      // an engine, by URL
	AreaLog         = "log"         // an engine's log, by its spec
	AreaProbe       = "probe"       // an engine's last probe, by capacity key
)

// Item is one thing the agent watches, as it stands now.
type Item struct {
	Area string `json:"area"`
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Reason is a short, stable word for what is wrong ("unreachable",
	// "missing", "refused"); a change of Reason is logged, a change of
	// Error alone is not.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// Since is when the thing entered its current state.
	Since time.Time `json:"since"`
}

// Board holds every Item. It is safe for concurrent use; the zero value
// is not: use New.
type Board struct {
	now func() time.Time

	mu    sync.Mutex
	items map[key]*entry
}

// entry is an Item and, while it fails, when it began to: a change of
// reason starts a new Since, not a new failure.
type entry struct {
	Item
	down time.Time
}

type key struct{ area, name string }

// New returns an empty Board.
func New() *Board {
	return &Board{now: time.Now, items: map[key]*entry{}}
}

// Items returns a copy of every Item, sorted by area and name.
func (b *Board) Items() []Item {
	b.mu.Lock()
	out := make([]Item, 0, len(b.items))
	for _, e := range b.items {
		out = append(out, e.Item)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y Item) int {
		return cmp.Or(cmp.Compare(x.Area, y.Area), cmp.Compare(x.Name, y.Name))
	})
	return out
}

// Get returns the Item of area and name, if anything reported it.
func (b *Board) Get(area, name string) (Item, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.items[key{area, name}]
	if !ok {
		return Item{}, false
	}
	return e.Item, true
}

// Reporter returns the way one part of the agent reports the things of
// area, each called by name (an URL, a path); lines are logged through
// logger, the part's own, with the name under nameKey ("url", "log").
func (b *Board) Reporter(area, nameKey string, logger hclog.Logger) *Reporter {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Reporter{b: b, area: area, nameKey: nameKey, log: logger}
}

// Reporter reports the things of one area to a Board.
type Reporter struct {
	b       *Board
	area    string
	nameKey string
	log     hclog.Logger
}

// Failure is what is wrong with a thing.
type Failure struct {
	// Reason is short and stable (see Item.Reason).
	Reason string
	// Msg is the log line's message, lowercase: "engine unreachable".
	Msg string
	// Err is the detail, logged under "error".
	Err string
	// Error logs at error level instead of warn: for what retrying cannot
	// mend (a refused token, a version mismatch).
	Error bool
	// Args are more key/value pairs for the log line (a hint).
	Args []any
}

// Fail records that name is failing. It logs the first failure, and a
// failure whose Reason differs from the one recorded; a repeat of the
// same Reason only updates the detail.
func (r *Reporter) Fail(name string, f Failure) {
	b := r.b
	now := b.now()
	b.mu.Lock()
	it, known := b.items[key{r.area, name}]
	if !known {
		it = &entry{Item: Item{Area: r.area, Name: name}}
		b.items[key{r.area, name}] = it
	}
	if !known || it.OK {
		it.down = now
	}
	changed := !known || it.OK || it.Reason != f.Reason
	if changed {
		it.Since = now
	}
	it.OK, it.Reason, it.Error = false, f.Reason, f.Err
	b.mu.Unlock()
	if !changed {
		return
	}
	args := append([]any{r.nameKey, name, "reason", f.Reason}, f.Args...)
	if f.Err != "" {
		args = append(args, "error", f.Err)
	}
	level := hclog.Warn
	if f.Error {
		level = hclog.Error
	}
	r.log.Log(level, f.Msg, args...)
}

// OK records that name works. When it was failing, OK logs msg (with
// args, and how long it failed, whatever the reasons) at info level and returns true; a thing
// that was fine, or never reported, changes silently.
func (r *Reporter) OK(name, msg string, args ...any) bool {
	b := r.b
	now := b.now()
	b.mu.Lock()
	it, known := b.items[key{r.area, name}]
	if !known {
		it = &entry{Item: Item{Area: r.area, Name: name, Since: now}}
		b.items[key{r.area, name}] = it
	}
	recovered := known && !it.OK
	var failedFor time.Duration
	if recovered {
		failedFor = now.Sub(it.down)
		it.Since = now
	}
	it.OK, it.Reason, it.Error = true, "", ""
	b.mu.Unlock()
	if recovered {
		r.log.Info(msg, append([]any{r.nameKey, name, "failed_for", failedFor.Round(time.Second).String()}, args...)...)
	}
	return recovered
}
