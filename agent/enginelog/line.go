package enginelog

import (
	"math"
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
}

// Pool formats.
const (
	FormatVLLMMerged     = "vllm-v1-merged"
	FormatVLLMTwoLine    = "vllm-v1-two-line"
	FormatVLLMBlocks     = "vllm-v0-blocks"
	FormatSGLangAlloc    = "sglang-kv-allocated"
	FormatSGLangMaxTotal = "sglang-max-total"
)

// maxRankValue bounds a rank number read from a prefix; larger ones are
// not a real deployment and the line is skipped.
const maxRankValue = 1 << 16

var (
	// ANSI escape sequences: vLLM colours the level, the time stamp and the
	// process prefix when writing to a terminal (or with FORCE_COLOR).
	ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

	// vLLM's per-process prefix: "(EngineCore_DP1 pid=212) " (v0.10.2 on),
	// "(EngineCore_1 pid=212) " (v0.8.3 to v0.10.1), "(VllmWorker rank=1
	// pid=9) " (a TP worker of v0.8 to v0.10), and Ray's "(RayWorkerWrapper
	// pid=3, ip=10.0.0.2) ", which Ray may nest before vLLM's own. Searched
	// anywhere in the line: whatever a log wrapper put before it is not the
	// engine's.
	vllmProcRE = regexp.MustCompile(`\(([^\s()]+)(?: rank=(\d+))? pid=\d+(?:, ip=[^)]*)?\) ?`)

	// vLLM's logger header after its level (see findVLLMHeader):
	// "INFO 12-11 00:06:53 [kv_cache_utils.py:1286] " (newest) or
	// "INFO 02-18 08:50:24 executor_base.py:108] " (2024).
	vllmHeaderRestRE = regexp.MustCompile(`^\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[^\s\[\]]+:\d+\] `)

	// Uvicorn's own lines, not formatted by vLLM: "INFO:     Application startup complete."
	uvicornRE = regexp.MustCompile(`(?:^|[^A-Za-z])(?:INFO|WARNING|ERROR):\s+`)

	vllmBlocksRE      = regexp.MustCompile(`^# (\w+) blocks: (\d+), # CPU blocks: (\d+)`)
	vllmConcurrencyRE = regexp.MustCompile(`^Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x`)
	vllmServerVerRE   = regexp.MustCompile(`^vLLM server version ([^\s,]+), serving model (.+)$`)
	vllmEngineInitRE  = regexp.MustCompile(`^Initializing an? (?:V\d+ )?LLM engine \(v([^)\s]+)\)`)
	vllmInitModelRE   = regexp.MustCompile(`(?:^|[ ,(])model='([^']*)'`)
	vllmInitServedRE  = regexp.MustCompile(`[ ,(]served_model_name=([^,\s)]+)`)

	// SGLang's header: "[2026-03-02 10:15:21.123 DP0 TP1] " with rank
	// tokens in any order (the order changed across versions). Searched
	// anywhere in the line, like vLLM's prefix.
	// SGLang 0.3 printed the time only ("[16:43:29 TP0] ").
	sglangHeaderRE = regexp.MustCompile(`\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d{1,6})?((?: [A-Za-z_]+\d+)*)\] ?`)
	// SGLang 0.2 tagged a worker's lines with its GPU: "[gpu=0] ".
	sglangGPUHeaderRE = regexp.MustCompile(`\[gpu=(\d+)\] ?`)

	// A data-parallel size on a command line: vLLM's --data-parallel-size
	// and -dp, SGLang's --data-parallel-size, --dp-size and --dp (argparse
	// takes an unambiguous prefix of a long option). A shell variable in
	// its place is read as "unknown".
	dpFlagRE = regexp.MustCompile(`(?:^|\s)(?:--data-parallel-size|--dp-size|--dp|-dp)(?:=|\s+)(\d+|["']?\$\{?\w+\}?["']?)(?:\s|$)`)
)

// ParseLine reads one log line of an engine of the given kind ("vllm" or
// "sglang"). It strips ANSI colour codes and reads every carriage-return
// separated segment (tqdm redraws its bar with '\r'; Windows ends lines
// with "\r\n"), returning the first event found. The engine's own prefix
// (vLLM's "(EngineCore_DP1 pid=N)" and logger header, SGLang's
// "[date DP1 TP0]") is found wherever it starts, so text a log wrapper put
// before it (a container runtime's, syslog's, or one heft does not know)
// never changes the rank a line is read for. A line in no known format
// gives ok=false: it is skipped, never guessed at.
func ParseLine(kind, line string) (Event, bool) {
	var first Event
	found := false
	scanLine(kind, line, func(ev Event) {
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
func scanLine(kind, line string, onEvent func(Event), onRank func(dp int, dpOnly bool)) {
	_, gr, ok := grammarOf(kind)
	if !ok {
		return
	}
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = ansiRE.ReplaceAllString(line, "")
	}
	rank := func(p proc) {
		if onRank != nil && p.hasDP && !p.bad {
			onRank(p.dp, p.dpOnly)
		}
	}
	// vLLM adds its process prefix only at the start of a '\n' line, so a
	// segment after a '\r' belongs to the process that began the line.
	inherited := proc{tp: -1}
	for i, seg := range strings.Split(line, "\r") {
		seg = strings.TrimSpace(seg)
		if seg == "" {
			continue
		}
		ev, segRank, ok := gr.segment(seg, i == 0, &inherited)
		// The event first: a start-up marker may begin a new start-up,
		// which the rank then belongs to.
		if ok {
			onEvent(ev)
		}
		rank(segRank)
	}
	router := strings.Contains(line, "sglang_router.launch_server")
	if (strings.Contains(line, "-dp") || strings.Contains(line, "data-parallel-size")) && dpFlagRE.MatchString(line) {
		m := dpFlagRE.FindStringSubmatch(line)
		n, err := strconv.Atoi(m[1])
		switch {
		case err != nil:
			n = -1 // a shell variable
		case n < 1 || n > maxRankValue:
			return
		}
		kind := EventDPSize
		if router {
			kind = EventRouter
		}
		onEvent(Event{Kind: kind, TPRank: -1, DPSize: n})
	} else if router {
		// The router's default is one worker per GPU it finds: unknown here.
		onEvent(Event{Kind: EventRouter, TPRank: -1, DPSize: -1})
	}
}

const (
	kindVLLM   = "vllm"
	kindSGLang = "sglang"
)

// vllmGrammar is vLLM's log grammar.
var vllmGrammar = grammar{
	segment: func(seg string, first bool, line *proc) (Event, proc, bool) {
		p, msg, hasProc, hasHeader := splitVLLM(seg)
		if hasProc && first {
			*line = p
		} else if !hasProc {
			p = *line
		}
		ev, ok := parseVLLM(msg, hasHeader, p)
		return ev, p, ok
	},
	formats:     []string{FormatVLLMMerged, FormatVLLMTwoLine, FormatVLLMBlocks},
	dpKey:       "data_parallel_size",
	serverPort:  "port",
	sharedPools: func(map[string]string) bool { return false },
	mistaken:    kindSGLang,
}

// sglangGrammar is SGLang's log grammar.
var sglangGrammar = grammar{
	segment: func(seg string, _ bool, _ *proc) (Event, proc, bool) {
		return parseSGLang(seg)
	},
	formats:     []string{FormatSGLangMaxTotal, FormatSGLangAlloc},
	dpKey:       "dp_size",
	serverPort:  "port",
	sharedPools: func(args map[string]string) bool { return args["enable_dp_attention"] == "True" },
	mistaken:    kindVLLM,
}

// proc is the rank a process prefix names.
type proc struct {
	dp, tp int
	hasDP  bool // the prefix named a DP rank (EngineCore_DP0, [... DP0])
	tpSet  bool // the prefix named a TP rank
	// dpOnly: the naming exists only with data parallelism (EngineCore_<n>,
	// an SGLang DP tag), unlike vLLM's EngineCore_DP0 of a single engine.
	dpOnly bool
	bad    bool // a rank number out of range: skip the line
}

// splitVLLM finds vLLM's logger header and process prefixes in a segment.
// The prefixes are every "(Name pid=N)" before the header (Ray nests its
// actor's before vLLM's) or, in a line without a header (a progress bar,
// uvicorn), the first one anywhere. Their Names give DPn/TPn
// (EngineCore_DP1, EngineCore_1, Worker_DP0_TP1, VllmWorker rank=1): the
// last prefix that names a DP rank gives it, and a line none names is rank
// 0. msg is the text after the header, or after the prefixes when there is
// no header.
func splitVLLM(seg string) (p proc, msg string, hasProc, hasHeader bool) {
	p = proc{tp: -1}
	hStart, hEnd, hasHeader := findVLLMHeader(seg)
	var all [][]int
	if strings.Contains(seg, " pid=") {
		if hasHeader {
			all = vllmProcRE.FindAllStringSubmatchIndex(seg[:hStart], -1)
		} else if m := vllmProcRE.FindStringSubmatchIndex(seg); m != nil {
			all = [][]int{m}
		}
	}
	msg = seg
	for _, m := range all {
		var one proc
		one.takeVLLMName(seg[m[2]:m[3]])
		if m[4] >= 0 {
			one.take("TP" + seg[m[4]:m[5]])
		}
		if one.bad {
			p.bad = true
		}
		if one.hasDP {
			p.dp, p.hasDP, p.dpOnly = one.dp, true, one.dpOnly
		}
		if one.tpSet {
			p.tp, p.tpSet = one.tp, true
		}
		msg, hasProc = seg[m[1]:], true
	}
	if hasHeader {
		msg = seg[hEnd:]
	}
	return p, msg, hasProc, hasHeader
}

// takeVLLMName reads a process name: "EngineCore_DP1", "Worker_DP0_TP1",
// and v0.8.3 to v0.10.1's "EngineCore_1", whose bare number is the DP rank
// (that naming exists only with data parallelism).
func (p *proc) takeVLLMName(name string) {
	parts := strings.Split(name, "_")
	for i, part := range parts {
		if i == 1 && parts[0] == "EngineCore" && part != "" && isAllDigits(part) {
			p.take("DP" + part)
			p.dpOnly = true
			continue
		}
		p.take(part)
	}
}

func isAllDigits(s string) bool {
	for i := range len(s) {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// vllmLevels are the level names vLLM's logger prints.
var vllmLevels = []string{"INFO ", "WARNING ", "DEBUG ", "ERROR ", "WARN ", "CRITICAL "}

// findVLLMHeader finds the first "LEVEL MM-DD HH:MM:SS [file:line] " in
// seg whose level does not continue a word (VLLM_LOGGING_PREFIX, or a log
// wrapper, may put any text before it). It looks for each level with
// strings.Index and matches the rest in place: a regular expression
// searching every position of a long line costs several times more.
func findVLLMHeader(seg string) (start, end int, ok bool) {
	start = len(seg)
	for _, level := range vllmLevels {
		for from := 0; from < start; {
			i := strings.Index(seg[from:start], level)
			if i < 0 {
				break
			}
			i += from
			from = i + 1
			if i > 0 && isLetter(seg[i-1]) {
				continue
			}
			if m := vllmHeaderRestRE.FindStringIndex(seg[i+len(level):]); m != nil {
				start, end, ok = i, i+len(level)+m[1], true
				break
			}
		}
	}
	return start, end, ok
}

func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// take reads one rank token such as DP1 or TP0 into p.
func (p *proc) take(tok string) {
	name := strings.TrimRight(tok, "0123456789")
	digits := tok[len(name):]
	if digits == "" || (name != "DP" && name != "TP") {
		return
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n > maxRankValue {
		p.bad = true
		return
	}
	if name == "DP" {
		p.dp, p.hasDP = n, true
	} else {
		p.tp, p.tpSet = n, true
	}
}

// parseVLLM reads the message of a vLLM segment: after its logger header
// (hasHeader), or else a uvicorn line.
func parseVLLM(msg string, hasHeader bool, p proc) (Event, bool) {
	if p.bad {
		return Event{}, false
	}
	if !hasHeader {
		if !strings.Contains(msg, "Application startup complete.") {
			return Event{}, false
		}
		m := uvicornRE.FindStringIndex(msg)
		if m != nil && strings.HasPrefix(msg[m[1]:], "Application startup complete.") {
			return Event{Kind: EventReady, DPRank: p.dp, TPRank: p.tp}, true
		}
		return Event{}, false
	}
	ev, ok := vllmMessage(msg)
	if !ok {
		return Event{}, false
	}
	ev.DPRank, ev.TPRank, ev.DPNamed = p.dp, p.tp, p.dpOnly
	return ev, true
}

func vllmMessage(msg string) (Event, bool) {
	switch {
	case strings.HasPrefix(msg, "GPU KV cache size: "):
		rest := msg[len("GPU KV cache size: "):]
		num, rest, ok := cutNumber(rest)
		if !ok || !strings.HasPrefix(rest, " tokens") {
			return Event{}, false
		}
		ev := Event{Kind: EventPool, Format: FormatVLLMTwoLine, KVTokens: num}
		rest = rest[len(" tokens"):]
		if strings.HasPrefix(rest, ", ") {
			if c, ok := parseConcurrency(rest[2:]); ok {
				ev.Format = FormatVLLMMerged
				ev.MaxModelLen, ev.Concurrency = c.MaxModelLen, c.Concurrency
			}
		}
		return ev, true
	case strings.HasPrefix(msg, "Maximum concurrency for "):
		return parseConcurrency(msg)
	case strings.HasPrefix(msg, "# "):
		m := vllmBlocksRE.FindStringSubmatch(msg)
		if m == nil {
			return Event{}, false
		}
		blocks, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			return Event{}, false
		}
		return Event{Kind: EventPool, Format: FormatVLLMBlocks, Blocks: blocks}, true
	case strings.HasPrefix(msg, "non-default args: "):
		pairs, err := parsePyDictArgs(msg[len("non-default args: "):])
		return argsEvent(pairs, err, vllmModelKeys), true
	case strings.HasPrefix(msg, "args: Namespace("):
		// 2024 vLLM logged the whole argparse Namespace.
		_, pairs, err := parsePyCallArgs(msg[len("args: "):])
		return argsEvent(pairs, err, vllmModelKeys), true
	case strings.HasPrefix(msg, "vLLM API server version "):
		v := strings.Fields(msg[len("vLLM API server version "):])
		if len(v) == 0 {
			return Event{}, false
		}
		return Event{Kind: EventVersion, Version: v[0]}, true
	case strings.HasPrefix(msg, "vLLM server version "):
		m := vllmServerVerRE.FindStringSubmatch(msg)
		if m == nil {
			return Event{}, false
		}
		return Event{Kind: EventVersion, Version: m[1], Model: strings.TrimSpace(m[2])}, true
	case strings.HasPrefix(msg, "Initializing a"):
		m := vllmEngineInitRE.FindStringSubmatch(msg)
		if m == nil {
			return Event{}, false
		}
		ev := Event{Kind: EventEngineInit, Version: m[1]}
		if s := vllmInitServedRE.FindStringSubmatch(msg); s != nil {
			ev.Model = s[1]
		} else if s := vllmInitModelRE.FindStringSubmatch(msg); s != nil {
			ev.Model = s[1]
		}
		return ev, true
	case strings.HasPrefix(msg, "Starting vLLM server on "),
		strings.HasPrefix(msg, "Starting vLLM API server "):
		return Event{Kind: EventReady}, true
	}
	return Event{}, false
}

func parseConcurrency(msg string) (Event, bool) {
	m := vllmConcurrencyRE.FindStringSubmatch(msg)
	if m == nil {
		return Event{}, false
	}
	n, _, ok := cutNumber(m[1])
	if !ok {
		return Event{}, false
	}
	c, err := strconv.ParseFloat(m[2], 64)
	if err != nil || math.IsInf(c, 0) || math.IsNaN(c) {
		return Event{}, false
	}
	return Event{Kind: EventConcurrency, MaxModelLen: n, Concurrency: c}, true
}

// cutNumber reads a non-negative integer with optional thousands
// separators ("373,696") from the start of s.
func cutNumber(s string) (int64, string, bool) {
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

// parseSGLang reads an SGLang segment: its header, found wherever it
// starts, and the message after it. p is the header's rank.
func parseSGLang(seg string) (Event, proc, bool) {
	p := proc{tp: -1}
	m := sglangHeaderRE.FindStringSubmatchIndex(seg)
	if m != nil {
		for _, tok := range strings.Fields(seg[m[2]:m[3]]) {
			p.take(tok)
		}
	} else if m = sglangGPUHeaderRE.FindStringSubmatchIndex(seg); m != nil {
		// 0.2's GPU tag is the worker's GPU, a TP rank of DP rank 0 as far
		// as this log can tell.
		p.take("TP" + seg[m[2]:m[3]])
	} else {
		return Event{}, p, false
	}
	if p.bad {
		return Event{}, p, false
	}
	// SGLang adds a DP tag only when dp_size > 1.
	p.dpOnly = p.hasDP
	ev, ok := sglangMessage(seg[m[1]:])
	ev.DPRank, ev.TPRank, ev.DPNamed = p.dp, p.tp, p.dpOnly
	return ev, p, ok
}

func sglangMessage(msg string) (Event, bool) {
	switch {
	case strings.HasPrefix(msg, "KV Cache is allocated. #tokens: "):
		// MHA: ", K size: 1.65 GB, V size: 1.65 GB"; MLA: ", KV size: 160.63 GB".
		// Requiring the comma keeps a line cut mid-number from counting.
		n, rest, ok := cutDigits(msg[len("KV Cache is allocated. #tokens: "):])
		if !ok || !strings.HasPrefix(rest, ",") {
			return Event{}, false
		}
		return Event{Kind: EventPool, Format: FormatSGLangAlloc, KVTokens: n}, true
	case strings.HasPrefix(msg, "max_total_num_tokens="):
		n, rest, ok := cutDigits(msg[len("max_total_num_tokens="):])
		if !ok || !strings.HasPrefix(rest, ",") {
			return Event{}, false
		}
		return Event{Kind: EventPool, Format: FormatSGLangMaxTotal, KVTokens: n}, true
	case strings.HasPrefix(msg, "server_args=ServerArgs("):
		_, pairs, err := parsePyCallArgs(msg[len("server_args="):])
		ev := argsEvent(pairs, err, sglangModelKeys)
		ev.Version = firstNonEmpty(ev.Args, "version", "sglang_version")
		return ev, true
	case strings.HasPrefix(msg, "The server is fired up and ready to roll!"):
		return Event{Kind: EventReady}, true
	}
	return Event{}, false
}

func cutDigits(s string) (int64, string, bool) {
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

// Launch-arg keys that name the served model, best first.
var (
	vllmModelKeys   = []string{"served_model_name", "model", "model_tag"}
	sglangModelKeys = []string{"served_model_name", "model_path"}
)

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

func firstNonEmpty(m map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := m[k]; v != "" && v != "None" {
			return v
		}
	}
	return ""
}
