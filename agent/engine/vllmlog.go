package engine

import (
	"math"
	"regexp"
	"strconv"
	"strings"

	"heft/agent/enginelog"
	"heft/shared/wire"
)

// vLLM's start-up log (reference/engines.md §1): the per-rank KV pools
// (V1's two-line and newest merged "GPU KV cache size" line, the same
// line naming another device on other platforms, V0's "# cuda blocks: N"
// times the block size), its launch args, version and readiness, with the
// rank every process prefix names.

// vLLM's pool formats.
const (
	FormatVLLMMerged  = "vllm-v1-merged"
	FormatVLLMTwoLine = "vllm-v1-two-line"
	FormatVLLMBlocks  = "vllm-v0-blocks"
	// FormatVLLMDevice is the V1 line naming a device other than the GPU:
	// 2026 vLLM prints "%s KV cache size: ..." with its platform's device
	// ("CPU KV cache size: 21,760 tokens, Maximum concurrency ..." on the
	// CPU backend and vllm-metal), and plugins print their own ("Spyre
	// KV cache size: N tokens"). Ranked after the GPU lines, so a
	// rank's GPU line wins over a host-side figure printed beside it.
	FormatVLLMDevice = "vllm-v1-device"
)

// vllmLog is vLLM's log grammar.
var vllmLog = enginelog.Grammar{
	Kind: wire.EngineVLLM,
	Segment: func(seg string, first bool, line *enginelog.Proc) (enginelog.Event, enginelog.Proc, bool) {
		p, msg, hasProc, hasHeader := splitVLLM(seg)
		if hasProc && first {
			*line = p
		} else if !hasProc {
			p = *line
		}
		ev, ok := parseVLLM(msg, hasHeader, p)
		return ev, p, ok
	},
	CommandLine: dpSizeCommand,
	Formats:     []string{FormatVLLMMerged, FormatVLLMTwoLine, FormatVLLMBlocks, FormatVLLMDevice},
	PoolLines: `vLLM V1 "GPU KV cache size: N tokens" (alone or merged with "Maximum concurrency for N tokens per request"; ` +
		`"CPU", "XPU", "TPU", "NPU", "HPU" or "Spyre" in place of "GPU" on those platforms), ` +
		`vLLM V0 "# cuda blocks: N, # CPU blocks: M" and "# GPU blocks: N, # CPU blocks: M", and "# GPU blocks: N" alone (V1, early 2025)`,
	BlockFormat:  FormatVLLMBlocks,
	BlockSizeKey: "block_size",
	// vLLM's block size on CUDA when none is given.
	DefaultBlockSize:  16,
	DPKey:             "data_parallel_size",
	ArgsOmitDefaultDP: true,
	ServerPort:        "port",
	MultiNodeKeys:     []string{"nnodes", "node_rank", "data_parallel_size_local", "data_parallel_start_rank", "data_parallel_rank", "headless"},
}

var (
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

	// V0's "# cuda blocks: N, # CPU blocks: M" (M is swap space), and the
	// same count alone: early 2025 V1 printed "# GPU blocks: N" (until
	// v0.7.3 named it in tokens), and V0's CPU backend "# CPU blocks: N",
	// its pool.
	vllmBlocksRE      = regexp.MustCompile(`^# (\w+) blocks: (\d+)(?:, # CPU blocks: \d+)?\s*$`)
	vllmConcurrencyRE = regexp.MustCompile(`^Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x`)
	vllmServerVerRE   = regexp.MustCompile(`^vLLM server version ([^\s,]+), serving model (.+)$`)
	vllmEngineInitRE  = regexp.MustCompile(`^Initializing an? (?:V\d+ )?LLM engine \(v([^)\s]+)\)`)
	vllmInitModelRE   = regexp.MustCompile(`(?:^|[ ,(])model='([^']*)'`)
	vllmInitServedRE  = regexp.MustCompile(`[ ,(]served_model_name=([^,\s)]+)`)
	// parallel_state.py: "rank 1 in world size 2 is assigned as DP rank 1,
	// PP rank 0, TP rank 0, EP rank 1".
	vllmAssignedDPRE = regexp.MustCompile(`^rank \d+ in world size \d+ is assigned as DP rank (\d+),`)
	// 2026 vLLM's version banner is an ASCII-art logo (log_version_and_model,
	// unless VLLM_DISABLE_LOG_LOGO): one message of several lines, each
	// under the logger's header, one of them ending in the version
	// ("... ▀▄▀ █  version 0.14.0"). A paste may show the CR each line
	// ends with as a literal "^M".
	vllmLogoVersionRE = regexp.MustCompile(`^[ █▄▀]*[█▄▀] +version (\S+?)(?:\^M)?$`)
)

// splitVLLM finds vLLM's logger header and process prefixes in a segment.
// The prefixes are every "(Name pid=N)" before the header (Ray nests its
// actor's before vLLM's) or, in a line without a header (a progress bar,
// uvicorn), the first one anywhere. Their Names give DPn/TPn
// (EngineCore_DP1, EngineCore_1, Worker_DP0_TP1, VllmWorker rank=1): the
// last prefix that names a DP rank gives it, and a line none names is rank
// 0. msg is the text after the header, or after the prefixes when there is
// no header.
func splitVLLM(seg string) (p enginelog.Proc, msg string, hasProc, hasHeader bool) {
	p = enginelog.NoProc()
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
		one := enginelog.NoProc()
		takeVLLMName(&one, seg[m[2]:m[3]])
		if seg[m[2]:m[3]] == "DPEngineCoreActor" {
			// The Ray DP backend's engine core actor: its name carries
			// no rank; the tracker learns it from the actor's own lines.
			p.Actor = strings.TrimSpace(seg[m[0]:m[1]])
		}
		if m[4] >= 0 {
			one.Take("TP" + seg[m[4]:m[5]])
		}
		if one.Bad {
			p.Bad = true
		}
		if one.HasDP {
			p.DP, p.HasDP, p.DPOnly = one.DP, true, one.DPOnly
		}
		if one.HasTP {
			p.TP, p.HasTP = one.TP, true
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
// (a single engine is "EngineCore_0" there too: launch args without
// data_parallel_size settle that it is the only rank; Grammar.ArgsOmitDefaultDP).
func takeVLLMName(p *enginelog.Proc, name string) {
	parts := strings.Split(name, "_")
	for i, part := range parts {
		if i == 1 && parts[0] == "EngineCore" && part != "" && isAllDigits(part) {
			p.Take("DP" + part)
			p.DPOnly = true
			continue
		}
		p.Take(part)
	}
}

func isAllDigits(s string) bool { return strings.Trim(s, "0123456789") == "" }

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

// parseVLLM reads the message of a vLLM segment: after its logger header
// (hasHeader), or else a uvicorn line.
func parseVLLM(msg string, hasHeader bool, p enginelog.Proc) (enginelog.Event, bool) {
	if p.Bad {
		return enginelog.Event{}, false
	}
	if !hasHeader {
		if !strings.Contains(msg, "Application startup complete.") {
			return enginelog.Event{}, false
		}
		m := uvicornRE.FindStringIndex(msg)
		if m != nil && strings.HasPrefix(msg[m[1]:], "Application startup complete.") {
			return enginelog.Event{Kind: enginelog.EventReady, DPRank: p.DP, TPRank: p.TP}, true
		}
		return enginelog.Event{}, false
	}
	ev, ok := vllmMessage(msg)
	if !ok {
		if p.Actor == "" || p.HasDP {
			return enginelog.Event{}, false
		}
		m := vllmAssignedDPRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		dp, err := strconv.Atoi(m[1])
		if err != nil || dp > 1<<16 {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventActorRank, DPRank: dp, TPRank: -1, Actor: p.Actor}, true
	}
	ev.DPRank, ev.TPRank, ev.DPNamed = p.DP, p.TP, p.DPOnly
	if !p.HasDP {
		ev.Actor = p.Actor
	}
	return ev, true
}

func vllmMessage(msg string) (enginelog.Event, bool) {
	switch device := vllmKVDevice(msg); {
	case device != "":
		num, rest, ok := enginelog.CutNumber(msg[len(device)+len(" KV cache size: "):])
		if !ok || !strings.HasPrefix(rest, " tokens") {
			return enginelog.Event{}, false
		}
		ev := enginelog.Event{Kind: enginelog.EventPool, Format: FormatVLLMTwoLine, KVTokens: num}
		rest = rest[len(" tokens"):]
		if strings.HasPrefix(rest, ", ") {
			if c, ok := parseConcurrency(rest[2:]); ok {
				ev.Format = FormatVLLMMerged
				ev.MaxModelLen, ev.Concurrency = c.MaxModelLen, c.Concurrency
			}
		}
		if device != "GPU" {
			ev.Format = FormatVLLMDevice
		}
		return ev, true
	case strings.HasPrefix(msg, "Maximum concurrency for "):
		return parseConcurrency(msg)
	case strings.HasPrefix(msg, "# "):
		m := vllmBlocksRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		blocks, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatVLLMBlocks, Blocks: blocks}, true
	case strings.HasPrefix(msg, "non-default args: "):
		return enginelog.ArgsFromPyDict(msg[len("non-default args: "):], vllmModelKeys), true
	case strings.HasPrefix(msg, "args: Namespace("):
		// 2024 vLLM logged the whole argparse Namespace.
		return enginelog.ArgsFromPyCall(msg[len("args: "):], vllmModelKeys), true
	case strings.HasPrefix(msg, "vLLM API server version "):
		v := strings.Fields(msg[len("vLLM API server version "):])
		if len(v) == 0 {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventVersion, Version: v[0]}, true
	case strings.Contains(msg, "█  version "):
		m := vllmLogoVersionRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventVersion, Version: m[1]}, true
	case strings.HasPrefix(msg, "vLLM server version "):
		m := vllmServerVerRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventVersion, Version: m[1], Model: strings.TrimSpace(m[2])}, true
	case strings.HasPrefix(msg, "Initializing a"):
		m := vllmEngineInitRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		ev := enginelog.Event{Kind: enginelog.EventEngineInit, Version: m[1]}
		if s := vllmInitServedRE.FindStringSubmatch(msg); s != nil {
			ev.Model = s[1]
		} else if s := vllmInitModelRE.FindStringSubmatch(msg); s != nil {
			ev.Model = s[1]
		}
		return ev, true
	case strings.HasPrefix(msg, "Starting vLLM server on "),
		strings.HasPrefix(msg, "Starting vLLM API server "):
		return enginelog.Event{Kind: enginelog.EventReady}, true
	}
	return enginelog.Event{}, false
}

func parseConcurrency(msg string) (enginelog.Event, bool) {
	m := vllmConcurrencyRE.FindStringSubmatch(msg)
	if m == nil {
		return enginelog.Event{}, false
	}
	n, _, ok := enginelog.CutNumber(m[1])
	if !ok {
		return enginelog.Event{}, false
	}
	c, err := strconv.ParseFloat(m[2], 64)
	if err != nil || math.IsInf(c, 0) || math.IsNaN(c) {
		return enginelog.Event{}, false
	}
	return enginelog.Event{Kind: enginelog.EventConcurrency, MaxModelLen: n, Concurrency: c}, true
}

// vllmKVDevices are the devices vLLM's KV cache size line names: "GPU" on
// CUDA and ROCm, the platform's device elsewhere (2026 vLLM's CPU backend
// and vllm-metal print "CPU"), and a plugin's own (vllm-spyre's "Spyre").
var vllmKVDevices = []string{"GPU", "CPU", "XPU", "TPU", "NPU", "HPU", "Spyre"}

// vllmKVDevice is the device msg's KV cache size line names, "" when msg
// is no such line.
func vllmKVDevice(msg string) string {
	for _, d := range vllmKVDevices {
		if strings.HasPrefix(msg, d) && strings.HasPrefix(msg[len(d):], " KV cache size: ") {
			return d
		}
	}
	return ""
}

// Launch-arg keys that name the served model, best first.
var vllmModelKeys = []string{"served_model_name", "model", "model_tag"}
