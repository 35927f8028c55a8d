package engine

import (
	"fmt"
	"strings"

	"heft/agent/enginelog"
	"heft/shared/wire"
)

// Each kind's start-up log grammar lives beside its descriptor
// (vllmlog.go, sglanglog.go, llamacpplog.go); enginelog reads a log with
// the grammar it is given.

func init() {
	// The kind each is most often mistaken for, for Read's "try engine"
	// hint. Set here: the two grammars naming each other in their
	// literals would be an initialisation cycle.
	vllmLog.Mistaken = &sglangLog
	sglangLog.Mistaken = &vllmLog
}

// LogGrammar returns the start-up log grammar of kind (case and spaces
// aside); for a kind whose log heft does not read, an error wrapping
// enginelog.ErrUnknownEngine that names the kinds it reads.
func LogGrammar(kind string) (*enginelog.Grammar, error) {
	d, ok := lookup(strings.ToLower(strings.TrimSpace(kind)))
	if !ok || d.log == nil {
		return nil, fmt.Errorf("%w %q: heft reads the start-up logs of %s", enginelog.ErrUnknownEngine, kind, strings.Join(LogKinds(), ", "))
	}
	return d.log, nil
}

// LogKinds lists the kinds whose start-up logs heft reads, in
// wire.EngineKinds' order.
func LogKinds() []string {
	var out []string
	for _, k := range wire.EngineKinds {
		if d, ok := lookup(k); ok && d.log != nil {
			out = append(out, k)
		}
	}
	return out
}

// LogGrammar is the grammar of the engine's start-up log; nil when heft
// reads none for its kind.
func (c *Client) LogGrammar() *enginelog.Grammar { return c.kind.log }

// dpSizeCommand reads a data-parallel size from a command line a launch
// script echoed into the log.
func dpSizeCommand(line string) (enginelog.Event, bool) {
	n, ok := enginelog.CommandLineDPSize(line)
	if !ok {
		return enginelog.Event{}, false
	}
	return enginelog.Event{Kind: enginelog.EventDPSize, TPRank: -1, DPSize: n}, true
}

// sglangCommand is dpSizeCommand that also knows SGLang's router: a
// command line "python -m sglang_router.launch_server --dp N" starts N
// separate servers whose lines carry TP tags only.
func sglangCommand(line string) (enginelog.Event, bool) {
	ev, ok := dpSizeCommand(line)
	if !strings.Contains(line, "sglang_router.launch_server") {
		return ev, ok
	}
	if !ok {
		// The router's default is one worker per GPU it finds: unknown here.
		ev.DPSize = -1
	}
	ev.Kind, ev.TPRank = enginelog.EventRouter, -1
	return ev, true
}
