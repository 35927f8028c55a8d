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

	// vLLM's per-process prefix, "(EngineCore_DP1 pid=212) ", and Ray's
	// "(RayWorkerWrapper pid=3, ip=10.0.0.2) ".
	vllmProcRE = regexp.MustCompile(`^\(([^\s()]+) pid=\d+(?:, ip=[^)]*)?\) ?`)

	// vLLM's logger header: "INFO 12-11 00:06:53 [kv_cache_utils.py:1286] "
	// (newest) or "INFO 02-18 08:50:24 executor_base.py:108] " (2024).
	// VLLM_LOGGING_PREFIX may put any text before the level.
	vllmHeaderRE = regexp.MustCompile(`(?:^|\s)(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[^\s\[\]]+:\d+\] `)

	// Uvicorn's own lines, not formatted by vLLM: "INFO:     Application startup complete."
	uvicornRE = regexp.MustCompile(`^(?:INFO|WARNING|ERROR):\s+`)

	vllmBlocksRE      = regexp.MustCompile(`^# (\w+) blocks: (\d+), # CPU blocks: (\d+)`)
	vllmConcurrencyRE = regexp.MustCompile(`^Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x`)
	vllmServerVerRE   = regexp.MustCompile(`^vLLM server version ([^\s,]+), serving model (.+)$`)
	vllmEngineInitRE  = regexp.MustCompile(`^Initializing an? (?:V\d+ )?LLM engine \(v([^)\s]+)\)`)
	vllmInitModelRE   = regexp.MustCompile(`(?:^|[ ,(])model='([^']*)'`)
	vllmInitServedRE  = regexp.MustCompile(`[ ,(]served_model_name=([^,\s)]+)`)

	// SGLang's header: "[2026-03-02 10:15:21.123 DP0 TP1] " with rank
	// tokens in any order (the order changed across versions).
	sglangHeaderRE = regexp.MustCompile(`^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,6})?((?: [A-Za-z_]+\d+)*)\] ?`)
)

// ParseLine reads one log line of an engine of the given kind ("vllm" or
// "sglang"). It strips ANSI colour codes and reads every carriage-return
// separated segment (tqdm redraws its bar with '\r'; Windows ends lines
// with "\r\n"), returning the first event found. A line in no known
// format gives ok=false: it is skipped, never guessed at.
func ParseLine(kind, line string) (Event, bool) {
	var first Event
	found := false
	eachEvent(kind, line, func(ev Event) {
		if !found {
			first, found = ev, true
		}
	})
	return first, found
}

// eachEvent calls fn for every event in line, in order.
func eachEvent(kind, line string, fn func(Event)) {
	k, ok := normKind(kind)
	if !ok {
		return
	}
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = ansiRE.ReplaceAllString(line, "")
	}
	// vLLM adds its process prefix only at the start of a '\n' line, so a
	// segment after a '\r' belongs to the process that began the line.
	inherited := proc{tp: -1}
	for i, seg := range strings.Split(line, "\r") {
		seg = strings.TrimSpace(seg)
		if seg == "" {
			continue
		}
		var ev Event
		var ok bool
		switch k {
		case kindVLLM:
			p, rest, has := vllmProc(seg)
			if has && i == 0 {
				inherited = p
			} else if !has {
				p = inherited
			}
			ev, ok = parseVLLM(rest, p)
		case kindSGLang:
			ev, ok = parseSGLang(seg)
		}
		if ok {
			fn(ev)
		}
	}
}

const (
	kindVLLM   = "vllm"
	kindSGLang = "sglang"
)

func normKind(kind string) (string, bool) {
	switch k := strings.ToLower(strings.TrimSpace(kind)); k {
	case kindVLLM, kindSGLang:
		return k, true
	}
	return "", false
}

// proc is the rank a process prefix names.
type proc struct {
	dp, tp int
	bad    bool // a rank number out of range: skip the line
}

// vllmProc splits off "(Name pid=N) " and reads DPn/TPn from Name
// (EngineCore_DP1, Worker_DP0_TP1). Name without a DP part is rank 0.
func vllmProc(seg string) (proc, string, bool) {
	p := proc{tp: -1}
	m := vllmProcRE.FindStringSubmatchIndex(seg)
	if m == nil {
		return p, seg, false
	}
	for _, part := range strings.Split(seg[m[2]:m[3]], "_") {
		p.take(part)
	}
	return p, seg[m[1]:], true
}

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
		p.dp = n
	} else {
		p.tp = n
	}
}

func parseVLLM(seg string, p proc) (Event, bool) {
	if p.bad {
		return Event{}, false
	}
	base := Event{DPRank: p.dp, TPRank: p.tp}
	if m := uvicornRE.FindStringIndex(seg); m != nil {
		if strings.HasPrefix(seg[m[1]:], "Application startup complete.") {
			base.Kind = EventReady
			return base, true
		}
		return Event{}, false
	}
	m := vllmHeaderRE.FindStringIndex(seg)
	if m == nil {
		return Event{}, false
	}
	msg := seg[m[1]:]
	ev, ok := vllmMessage(msg)
	if !ok {
		return Event{}, false
	}
	ev.DPRank, ev.TPRank = base.DPRank, base.TPRank
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

func parseSGLang(seg string) (Event, bool) {
	m := sglangHeaderRE.FindStringSubmatchIndex(seg)
	if m == nil {
		return Event{}, false
	}
	p := proc{tp: -1}
	for _, tok := range strings.Fields(seg[m[2]:m[3]]) {
		p.take(tok)
	}
	if p.bad {
		return Event{}, false
	}
	ev, ok := sglangMessage(seg[m[1]:])
	ev.DPRank, ev.TPRank = p.dp, p.tp
	return ev, ok
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
