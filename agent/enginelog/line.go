package enginelog

import (
	"regexp"
	"strconv"
	"strings"
)

// EventKind says what a log line told.
type EventKind int

// Event kinds.
const (
	// EventPool: the KV pool of DPRank, as KVTokens or (vLLM V0) Blocks.
	EventPool EventKind = iota + 1
	// EventConcurrency: vLLM's "Maximum concurrency" line on its own.
	EventConcurrency
	// EventLaunchArgs: the launch arguments, a start-up marker.
	EventLaunchArgs
	// EventVersion: a version banner, a start-up marker.
	EventVersion
	// EventEngineInit: one vLLM engine core (one DP rank) starts.
	EventEngineInit
	// EventReady: the server said it is ready.
	EventReady
	// EventDPSize: a command line in the log names the data-parallel size
	// ("--data-parallel-size 4", "--dp-size 4", "--dp 4", "-dp 4"), as a
	// launch script that echoes its command prints it. DPSize is -1 when
	// the size is a shell variable ("--dp $DP_SIZE"): there are ranks, but
	// the log cannot say how many.
	EventDPSize
	// EventRouter: a command line starts SGLang's router with its own
	// workers ("python -m sglang_router.launch_server --dp N"): N separate
	// servers whose lines carry TP tags only. DPSize is N, -1 if unknown.
	EventRouter
	// EventActorRank: a line of a Ray actor whose name carries no rank
	// (vLLM's DPEngineCoreActor, --data-parallel-backend=ray) says which
	// DP rank it runs; Actor names the actor, DPRank is the rank. Later
	// lines of that actor belong to that rank.
	EventActorRank
)

func (k EventKind) String() string {
	switch k {
	case EventPool:
		return "pool"
	case EventConcurrency:
		return "concurrency"
	case EventLaunchArgs:
		return "launch_args"
	case EventVersion:
		return "version"
	case EventEngineInit:
		return "engine_init"
	case EventReady:
		return "ready"
	case EventDPSize:
		return "dp_size"
	case EventRouter:
		return "router"
	case EventActorRank:
		return "actor_rank"
	}
	return "unknown"
}

// Event is what one line told.
type Event struct {
	Kind EventKind
	// DPRank is the data-parallel rank the line belongs to; 0 when the line
	// names none (a single engine, or a main-process line).
	DPRank int
	// TPRank is the tensor-parallel rank the line names, -1 when none.
	TPRank int

	Format   string // EventPool: which pool format matched
	KVTokens int64  // EventPool: tokens in the pool (0 when Blocks is set)
	Blocks   int64  // EventPool, vLLM V0: GPU blocks; tokens = Blocks × block size
	// Cells and Streams, on an EventPool of a cache split into streams
	// (llama.cpp's "(N cells, L layers, A/S seqs)"), are one stream's
	// cells and how many streams the cache keeps (1 for a unified cache,
	// or a line from before streams); 0 when the line names none. They
	// tell a Grammar.PerStream figure of the same cache its streams.
	Cells, Streams int64

	MaxModelLen int64   // EventConcurrency and the merged vLLM pool line
	Concurrency float64 // ditto

	Args    map[string]string // EventLaunchArgs
	ArgsErr string            // EventLaunchArgs: why the args could not be read whole; Args holds what was

	Version string // EventVersion, EventEngineInit
	Model   string // EventLaunchArgs, EventVersion, EventEngineInit: the served model, if the line names it

	DPSize int // EventDPSize, EventRouter: -1 when a shell variable hides it
	// DPNamed: the line's rank came from a naming that exists only with data
	// parallelism (vLLM's EngineCore_<n> of v0.8.3 to v0.10.1, an SGLang
	// DP<n> tag), so the engine runs more than one rank.
	DPNamed bool
	// Actor is the prefix of the Ray actor that printed the line when its
	// name carries no rank ("DPEngineCoreActor pid=5439, ip=10.0.0.2"):
	// the tracker gives the line the rank an EventActorRank named for it.
	Actor string
}

// maxRankValue bounds a rank number read from a prefix; larger ones are
// not a real deployment and the line is skipped.
const maxRankValue = 1 << 16

var (
	// ANSI escape sequences: vLLM colours the level, the time stamp and the
	// process prefix when writing to a terminal (or with FORCE_COLOR).
	ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

	// A data-parallel size on a command line: vLLM's --data-parallel-size
	// and -dp, SGLang's --data-parallel-size, --dp-size and --dp (argparse
	// takes an unambiguous prefix of a long option). A shell variable in
	// its place is read as "unknown".
	dpFlagRE = regexp.MustCompile(`(?:^|\s)(?:--data-parallel-size|--dp-size|--dp|-dp)(?:=|\s+)(\d+|["']?\$\{?\w+\}?["']?)(?:\s|$)`)
)

// ParseLine reads one log line with grammar g. It strips ANSI colour
// codes and reads every carriage-return separated segment (tqdm redraws
// its bar with '\r'; Windows ends lines with "\r\n"), returning the first
// event found. The grammar finds the engine's own prefix (vLLM's
// "(EngineCore_DP1 pid=N)" and logger header, SGLang's "[date DP1 TP0]")
// wherever it starts, so text a log wrapper put before it (a container
// runtime's, syslog's, or one heft does not know) never changes the rank a
// line is read for. A line in no known format gives ok=false: it is
// skipped, never guessed at.
func ParseLine(g *Grammar, line string) (Event, bool) {
	var first Event
	found := false
	scanLine(g, line, func(ev Event) {
		if !found {
			first, found = ev, true
		}
	}, nil)
	return first, found
}

// scanLine calls onEvent for every event in line, in order, and onRank
// (when not nil) with the data-parallel rank of every segment whose prefix
// names one, event or not: a rank that prints lines but no pool is a rank
// the pools must account for.
func scanLine(g *Grammar, line string, onEvent func(Event), onRank func(dp int, dpOnly bool)) {
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = ansiRE.ReplaceAllString(line, "")
	}
	rank := func(p Proc) {
		if onRank != nil && p.HasDP && !p.Bad {
			onRank(p.DP, p.DPOnly)
		}
	}
	// vLLM adds its process prefix only at the start of a '\n' line, so a
	// segment after a '\r' belongs to the process that began the line.
	inherited := NoProc()
	for i, seg := range strings.Split(line, "\r") {
		seg = strings.TrimSpace(seg)
		if seg == "" {
			continue
		}
		ev, segRank, ok := g.Segment(seg, i == 0, &inherited)
		// The event first: a start-up marker may begin a new start-up,
		// which the rank then belongs to.
		if ok {
			onEvent(ev)
		}
		rank(segRank)
	}
	if g.CommandLine != nil {
		if ev, ok := g.CommandLine(line); ok {
			onEvent(ev)
		}
	}
}

// CommandLineDPSize reads a data-parallel size from a command line in a
// log ("--data-parallel-size 4", "--dp-size 4", "--dp 4", "-dp 4"), as a
// launch script that echoes its command prints it: n is -1 when a shell
// variable stands for it ("--dp $DP_SIZE"). ok is false for a line that
// names none, or one out of range.
func CommandLineDPSize(line string) (n int, ok bool) {
	if !strings.Contains(line, "-dp") && !strings.Contains(line, "data-parallel-size") {
		return 0, false
	}
	m := dpFlagRE.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	switch {
	case err != nil:
		return -1, true
	case n < 1 || n > maxRankValue:
		return 0, false
	}
	return n, true
}

// Proc is the rank a line's prefix names.
type Proc struct {
	DP, TP int
	HasDP  bool // the prefix named a DP rank (EngineCore_DP0, [... DP0])
	HasTP  bool // the prefix named a TP rank
	// DPOnly: the naming exists only with data parallelism (EngineCore_<n>,
	// an SGLang DP tag), unlike vLLM's EngineCore_DP0 of a single engine.
	DPOnly bool
	Bad    bool // a rank number out of range: skip the line
	// Actor: the line came from a Ray actor whose name carries no rank
	// (see Event.Actor); "" otherwise.
	Actor string
}

// NoProc is a prefix that names no rank.
func NoProc() Proc { return Proc{TP: -1} }

// Take reads one rank token such as DP1 or TP0 into p; other tokens are
// ignored.
func (p *Proc) Take(tok string) {
	name := strings.TrimRight(tok, "0123456789")
	digits := tok[len(name):]
	if digits == "" || (name != "DP" && name != "TP") {
		return
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n > maxRankValue {
		p.Bad = true
		return
	}
	if name == "DP" {
		p.DP, p.HasDP = n, true
	} else {
		p.TP, p.HasTP = n, true
	}
}

// CutNumber reads a non-negative integer with optional thousands
// separators ("373,696") from the start of s.
func CutNumber(s string) (int64, string, bool) {
	i := 0
	for i < len(s) && (isDigit(s[i]) || (s[i] == ',' && i > 0 && i+1 < len(s) && isDigit(s[i+1]))) {
		i++
	}
	if i == 0 {
		return 0, s, false
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(s[:i], ",", ""), 10, 64)
	if err != nil {
		return 0, s, false
	}
	return n, s[i:], true
}

// CutDigits reads a non-negative integer from the start of s.
func CutDigits(s string) (int64, string, bool) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, s, false
	}
	return n, s[i:], true
}

// ArgsFromPyDict reads launch args printed as a Python dict (vLLM's
// "non-default args: {...}"), the model from the first of modelKeys that
// names one.
func ArgsFromPyDict(text string, modelKeys []string) Event {
	pairs, err := parsePyDictArgs(text)
	return argsEvent(pairs, err, modelKeys)
}

// ArgsFromPyCall reads launch args printed as a Python call
// ("Namespace(...)", SGLang's "ServerArgs(...)"), the model from the first
// of modelKeys that names one.
func ArgsFromPyCall(text string, modelKeys []string) Event {
	_, pairs, err := parsePyCallArgs(text)
	return argsEvent(pairs, err, modelKeys)
}

func argsEvent(pairs []pyArg, err error, modelKeys []string) Event {
	ev := Event{Kind: EventLaunchArgs, Args: make(map[string]string, len(pairs))}
	for _, a := range pairs {
		ev.Args[a.Key] = a.Val.plain()
	}
	if err != nil {
		ev.ArgsErr = err.Error()
	}
	for _, k := range modelKeys {
		for _, a := range pairs {
			if a.Key == k {
				if m := modelName(a.Val); m != "" {
					ev.Model = m
					return ev
				}
			}
		}
	}
	return ev
}

// modelName reads a model from an arg: a string, or the first of a list
// (vLLM's served_model_name is a list).
func modelName(v pyValue) string {
	switch v.Kind {
	case pyStr:
		return v.Text
	case pyList, pyTuple:
		if len(v.Items) > 0 && v.Items[0].Kind == pyStr {
			return v.Items[0].Text
		}
	}
	return ""
}
