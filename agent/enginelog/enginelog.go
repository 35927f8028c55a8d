// Package enginelog reads vLLM and SGLang start-up logs (and llama.cpp's
// and Ollama's, whose one pool heft-agent pools shows): the KV pool of
// every data-parallel rank, the launch arguments, the version, the served
// model and whether the server said it is ready.
//
// The per-rank pools are printed in each rank's start-up log and nowhere
// else reliably (vLLM's /metrics sums them over ranks; SGLang's server_info
// shows the first rank only), so this is the agent's source for them. The
// formats are those of reference/engines.md §1 and §2: vLLM V1 (the
// two-line and the newest merged "GPU KV cache size" line), vLLM V0
// ("# cuda blocks: N" times the block size) and SGLang ("KV Cache is
// allocated. #tokens: N" and "max_total_num_tokens=N").
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
	Engine string // "vllm" | "sglang"
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
}

// ErrNoPools is wrapped by Read's error when no pool line was found.
var ErrNoPools = errors.New(`no KV pool line found; looked for vLLM V1 "GPU KV cache size: N tokens" ` +
	`(alone or merged with "Maximum concurrency for N tokens per request"), ` +
	`vLLM V0 "# cuda blocks: N, # CPU blocks: M" and "# GPU blocks: N, # CPU blocks: M", ` +
	`SGLang "KV Cache is allocated. #tokens: N" (MHA and MLA) and SGLang "max_total_num_tokens=N", ` +
	`llama.cpp and Ollama "llama_kv_cache: size = ... (N cells, ..." and "n_ctx = N"`)

// ErrSeveralServers is wrapped by Read's error when the log holds several
// servers (SGLang router workers): no pool line can be told to be one's.
var ErrSeveralServers = errors.New("several servers in one log")

// ErrUnknownEngine is returned for an engine kind whose log enginelog
// cannot read.
var ErrUnknownEngine = errors.New("unknown engine kind (enginelog reads vllm, sglang, llamacpp and ollama logs)")

// MaxLineBytes is the longest line Read keeps; the rest of a longer line
// is skipped so one runaway line cannot exhaust memory.
const MaxLineBytes = 1 << 20

// Read parses a whole start-up log. Without a pool line it returns the
// facts it did find together with an error wrapping ErrNoPools.
func Read(kind string, r io.Reader) (Facts, error) {
	return ReadEach(kind, func(yield func(string)) error {
		return logfollow.ReadLines(r, MaxLineBytes, yield)
	})
}

// ReadEach is Read for lines from elsewhere (agent/logsource): each calls
// yield with every line of the log and returns an error when its source
// cannot be read.
func ReadEach(kind string, each func(yield func(line string)) error) (Facts, error) {
	t, err := NewTracker(kind)
	if err != nil {
		return Facts{}, err
	}
	// A log read with the wrong --engine is the commonest mistake; the
	// other kind's tracker lets the error say so.
	other, _ := NewTracker(t.gr.mistaken)
	lines := 0
	err = each(func(line string) {
		lines++
		t.Feed(line)
		if other != nil {
			other.Feed(line)
		}
	})
	if err != nil {
		return Facts{}, fmt.Errorf("read %s log: %w", t.kind, err)
	}
	f, ok := t.Facts()
	if !ok && f.Servers == 0 {
		if pf, pok := t.previousFacts(); pok {
			return pf, nil
		}
	}
	if !ok && f.Servers != 0 {
		return f, fmt.Errorf("%s log of %d lines: %w: %s", t.kind, lines, ErrSeveralServers, f.RankCountUnknown)
	}
	if !ok {
		hint := ""
		if other == nil {
			// no other kind to suggest
		} else if _, otherOK := other.Facts(); otherOK {
			hint = fmt.Sprintf(", but it has %s pool lines: try engine %q", other.kind, other.kind)
		}
		return f, fmt.Errorf("%s log of %d lines%s: %w", t.kind, lines, hint, ErrNoPools)
	}
	return f, nil
}
