// Package enginelog reads engine start-up logs: the KV pool of every
// data-parallel rank, the launch arguments, the version, the served model
// and whether the server said it is ready.
//
// The per-rank pools are printed in each rank's start-up log and nowhere
// else reliably (vLLM's /metrics sums them over ranks; SGLang's server_info
// shows the first rank only), so this is the agent's source for them. What
// a kind's lines look like is its Grammar, which lives beside the kind's
// descriptor in agent/engine (engine.LogGrammar): this package holds what
// every kind shares (segments, ranks, start-ups, folding TP ranks,
// completeness) and knows no kind by name.
//
// A line in an unknown format is skipped. Read parses a whole log; a
// Tracker is fed line by line by a follower (agent/logfollow).
package enginelog

import (
	"errors"
	"fmt"
	"io"

	"heft/agent/logfollow"
	"heft/shared/wire"
)

// Facts is what a start-up log told about the engine's latest start-up.
type Facts struct {
	Engine string // the grammar's Kind: "vllm", "sglang", "llamacpp", "ollama"
	// Ranks holds one KV pool per data-parallel rank, sorted by DPRank.
	Ranks []wire.Rank
	// ExpectedRanks is how many data-parallel ranks this start-up has: the
	// largest of the launch args' DP size, a DP size on a command line in
	// the log, and one more than the highest DP rank any line names (a
	// "DP3" prefix means ranks 0 to 3), at most wire.MaxRanks. 0 until the
	// log showed a start-up or a rank. For the wire: expected_ranks.
	ExpectedRanks int
	// Complete is true when every rank 0 to ExpectedRanks-1 has a pool.
	// When it is false the smallest pool is unknown: a missing rank may be
	// still starting, have failed before sizing its KV cache, or run on
	// another node. For the wire: complete.
	Complete bool
	// MissingRanks lists the DP ranks below ExpectedRanks without a pool.
	MissingRanks []int
	// ExpectedFrom says what ExpectedRanks was read from, for messages:
	// e.g. "launch args data_parallel_size=4", "a DP3 line prefix".
	ExpectedFrom string
	// LaunchArgs maps each launch argument to its value as printed:
	// strings unquoted, True/False/None as words, containers as their
	// Python repr. Redacted values stay "***".
	LaunchArgs map[string]string
	Version    string
	Model      string
	Ready      bool
	// Restarts counts the start-ups this log showed after the first one;
	// each replaced the previous start-up's facts.
	Restarts int
	// Format names the pool format the ranks came from, e.g.
	// "vllm-v1-merged"; formats joined by "," if ranks differ.
	Format string

	// Startups counts every start-up the log showed (Restarts + 1 once a
	// start-up was seen).
	Startups int
	// DPSize is the data-parallel size the launch args ask for (vLLM
	// data_parallel_size, SGLang dp_size); 0 when they do not say.
	DPSize int
	// FromPreviousFile is true when these facts were read before the
	// followed file was truncated or replaced (Tracker.Reset) and the new
	// content has shown no start-up since: right if the engine kept
	// running (log rotation), stale if it restarted.
	FromPreviousFile bool
	// RankCountUnknown says why the log cannot show how many ranks there
	// are (DP tags or a shell variable but no DP size; several servers);
	// Complete is then false and means "not known", never "some missing".
	RankCountUnknown string
	// Servers is how many separate servers the log holds when more than
	// one (SGLang router workers: -1 when their number is unknown); their
	// pools are not reported, as no line can be told to belong to one.
	Servers int
	// MultiNode describes a multi-node launch ("nnodes=2, node_rank=1"):
	// this log holds this node's ranks only.
	MultiNode string
	// Notes explain choices made: TP ranks that disagreed, a default
	// block size, arguments that could not be read whole.
	Notes []string
	// BannerOnly is true when the latest start-up has shown its version
	// banner and nothing after it yet: no launch args, engine core, rank,
	// pool or readiness. Read from a live file, the follower is most
	// likely between the banner and the lines that follow it, so these
	// facts do not yet say which launch this is.
	BannerOnly bool
}

// ErrNoPools is wrapped by Read's error when no pool line was found; the
// error says what the kind's pool lines look like.
var ErrNoPools = errors.New("no KV pool line found")

// ErrSeveralServers is wrapped by Read's error when the log holds several
// servers (SGLang router workers): no pool line can be told to be one's.
var ErrSeveralServers = errors.New("several servers in one log")

// ErrUnknownEngine is wrapped by the error for an engine kind without a
// log grammar (engine.LogGrammar), and by Read's for a nil grammar.
var ErrUnknownEngine = errors.New("no start-up log grammar for engine kind")

// MaxLineBytes is the longest line Read keeps; the rest of a longer line
// is skipped so one runaway line cannot exhaust memory.
const MaxLineBytes = 1 << 20

// Read parses a whole start-up log written in grammar g. Without a pool
// line it returns the facts it did find together with an error wrapping
// ErrNoPools.
func Read(g *Grammar, r io.Reader) (Facts, error) {
	return ReadEach(g, func(yield func(string)) error {
		return logfollow.ReadLines(r, MaxLineBytes, yield)
	})
}

// ReadEach is Read for lines from elsewhere (agent/logsource): each calls
// yield with every line of the log and returns an error when its source
// cannot be read.
func ReadEach(g *Grammar, each func(yield func(line string)) error) (Facts, error) {
	if g == nil {
		return Facts{}, ErrUnknownEngine
	}
	t := NewTracker(g)
	// A log read with the wrong --engine is the commonest mistake; the
	// other kind's tracker lets the error say so.
	var other *Tracker
	if g.Mistaken != nil {
		other = NewTracker(g.Mistaken)
	}
	lines := 0
	err := each(func(line string) {
		lines++
		t.Feed(line)
		if other != nil {
			other.Feed(line)
		}
	})
	if err != nil {
		return Facts{}, fmt.Errorf("read %s log: %w", g.Kind, err)
	}
	f, ok := t.Facts()
	if !ok && f.Servers == 0 {
		if pf, pok := t.previousFacts(); pok {
			return pf, nil
		}
	}
	if !ok && f.Servers != 0 {
		return f, fmt.Errorf("%s log of %d lines: %w: %s", g.Kind, lines, ErrSeveralServers, f.RankCountUnknown)
	}
	if !ok {
		hint := ""
		if other == nil {
			// no other kind to suggest
		} else if _, otherOK := other.Facts(); otherOK {
			hint = fmt.Sprintf(", but it has %s pool lines: try engine %q", other.gr.Kind, other.gr.Kind)
		}
		return f, fmt.Errorf("%s log of %d lines%s: %w; looked for %s", g.Kind, lines, hint, ErrNoPools, g.PoolLines)
	}
	return f, nil
}
