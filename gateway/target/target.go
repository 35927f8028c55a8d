// Package target holds what heft-sync wants a gateway to do for one model
// (Model, Backend), how a gateway driver is driven (Target), and how its
// failures are classified (Fail, Reason).
package target

import (
	"context"
	"errors"
	"fmt"

	"heft/shared/view"
)

// Target keeps one gateway's view of one model in step with heft.
type Target interface {
	// Name identifies the target in logs and metric labels, e.g.
	// "haproxy:qwen".
	Name() string
	// Model is the coordinator's model name this target follows.
	Model() string
	// Apply brings the gateway to m. It reads the gateway's state first
	// and changes only what differs, so calling it again with the same m
	// is how drift (a restarted gateway) is repaired. An error may come
	// with a partial Result: what was changed before it.
	Apply(ctx context.Context, m Model) (Result, error)
}

// Selection is which of a model's weights a target applies, and which
// workers it serves: a gateway table's kind and min_context_tokens.
type Selection struct {
	// Kind is view.WeightDecode ("" too) or view.WeightPrefill.
	Kind string
	// MinContextTokens serves only workers known to hold sequences this
	// long (max_context_tokens); the others are drained. 0 = every worker.
	MinContextTokens int64
}

// Validate returns every problem with a gateway table's kind and
// min_context_tokens.
func (s Selection) Validate() error {
	var errs []error
	if s.Kind != "" && s.Kind != view.WeightDecode && s.Kind != view.WeightPrefill {
		errs = append(errs, fmt.Errorf("kind %q: want %q (the default) or %q", s.Kind, view.WeightDecode, view.WeightPrefill))
	}
	if s.MinContextTokens < 0 {
		errs = append(errs, fmt.Errorf("min_context_tokens %d is negative", s.MinContextTokens))
	}
	return errors.Join(errs...)
}

// Selected is a Target with a Selection; a Target that is not applies the
// decode weight to every worker.
type Selected interface {
	Selection() Selection
}

// SelectionOf is what t applies.
func SelectionOf(t Target) Selection {
	if s, ok := t.(Selected); ok {
		return s.Selection()
	}
	return Selection{Kind: view.WeightDecode}
}

// WithSelection makes t apply sel: t itself for the default selection.
func WithSelection(t Target, sel Selection) Target {
	if sel.Kind == "" {
		sel.Kind = view.WeightDecode
	}
	if sel == (Selection{Kind: view.WeightDecode}) {
		return t
	}
	return selected{Target: t, sel: sel}
}

type selected struct {
	Target
	sel Selection
}

func (s selected) Selection() Selection { return s.sel }

// Unwrap is the target with its selection taken off.
func (s selected) Unwrap() Target { return s.Target }

// As finds, in t or the target a selection wraps, an implementation of I
// (a driver's optional abilities: a check, a watch).
func As[I any](t Target) (I, bool) {
	for {
		if i, ok := t.(I); ok {
			return i, true
		}
		u, ok := t.(interface{ Unwrap() Target })
		if !ok {
			var zero I
			return zero, false
		}
		t = u.Unwrap()
	}
}

// Result is what one Apply did.
type Result struct {
	// Changes lists, one line each, what was changed on the gateway;
	// empty when it already matched.
	Changes []string
	// RoundingError is the largest relative error of a serving worker's
	// share of traffic after scaling weights to the gateway's integers.
	RoundingError float64
	// Serving is how many workers the gateway now sends new requests to.
	Serving int
	// Dropped lists, one line each, the workers left out of the gateway
	// because it could not take them (an address no gateway may be given,
	// an entry its config check refused), while the others were applied.
	Dropped []string
}

// Failure reasons, the label of heft_sync_apply_failures_total.
const (
	ReasonUnreachable = "unreachable"   // the gateway's socket or port refused or timed out
	ReasonNoBackend   = "no_backend"    // the backend/upstream/cluster named does not exist
	ReasonRejected    = "rejected"      // the gateway refused a command or did not take it
	ReasonNoSlot      = "no_slot"       // a worker has no server to go in
	ReasonResolve     = "resolve"       // a worker's host name does not resolve
	ReasonWrite       = "write"         // a file could not be written
	ReasonCheck       = "check_failed"  // the gateway's config check refused the new file
	ReasonReload      = "reload_failed" // the reload command failed
	ReasonCommand     = "command_failed"
	ReasonNoServers   = "no_servers" // nothing to write: the gateway cannot take an empty list
	ReasonOther       = "other"
)

// Reasons lists every reason, for metrics that start at zero.
var Reasons = []string{ReasonUnreachable, ReasonNoBackend, ReasonRejected, ReasonNoSlot, ReasonResolve,
	ReasonWrite, ReasonCheck, ReasonReload, ReasonCommand, ReasonNoServers, ReasonOther}

// Error is a failure with its reason.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Fail wraps err with a reason.
func Fail(reason string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Reason: reason, Err: err}
}

// Failf is Fail with a formatted error.
func Failf(reason, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Reason returns the reason of the first Error in err's chain, or
// ReasonOther.
func Reason(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ReasonOther
}

// Served is one server a gateway sends new requests to now, as the gateway
// has it: its address and its weight, in the gateway's own units.
type Served struct {
	Address string
	Weight  float64
	// Owned: heft-sync owns the server whether or not the coordinator
	// lists a worker at its address (an HAProxy slot or server heft-sync
	// added, any line of the nginx file heft-sync writes). A server the
	// operator listed in HAProxy is heft's only while a worker is there.
	Owned bool
}
