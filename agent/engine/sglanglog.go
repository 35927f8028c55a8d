package engine

import (
	"regexp"
	"strings"

	"heft/agent/enginelog"
	"heft/shared/wire"
)

// SGLang's start-up log (reference/engines.md §2): "KV Cache is
// allocated. #tokens: N" per TP rank and the scheduler's
// "max_total_num_tokens=N", its server args, and readiness, with the
// rank its header's DP and TP tags name.

// SGLang's pool formats.
const (
	FormatSGLangAlloc    = "sglang-kv-allocated"
	FormatSGLangMaxTotal = "sglang-max-total"
	// FormatSGLangDSv4 is DeepSeek-V4's pool configurator's full-attention
	// pool, "DSV4 pool sizes: full=N, swa=...": its compressed layout
	// prints no "KV Cache is allocated" line, and a rank that prints no
	// max_total_num_tokens (DP attention) shows its pool only here.
	FormatSGLangDSv4 = "sglang-dsv4-pool-sizes"
	// FormatSGLangDSv4Memory is the same configurator's profiled figure,
	// "DSv4 memory calculation: ... full_token=N": before a configured
	// --max-total-tokens clamps it, so the last choice.
	FormatSGLangDSv4Memory = "sglang-dsv4-memory"
)

// sglangLog is SGLang's log grammar.
var sglangLog = enginelog.Grammar{
	Kind: wire.EngineSGLang,
	Segment: func(seg string, _ bool, _ *enginelog.Proc) (enginelog.Event, enginelog.Proc, bool) {
		return parseSGLang(seg)
	},
	CommandLine: sglangCommand,
	Formats:     []string{FormatSGLangMaxTotal, FormatSGLangAlloc, FormatSGLangDSv4, FormatSGLangDSv4Memory},
	// The configurator sizes the pools, then again when a configured
	// maximum clamps them, printing both.
	Resized: []string{FormatSGLangDSv4, FormatSGLangDSv4Memory},
	PoolLines: `SGLang "KV Cache is allocated. #tokens: N" (MHA and MLA; 2026 names the dtype first), SGLang "max_total_num_tokens=N" ` +
		`and DeepSeek-V4's "DSV4 pool sizes: full=N" and "DSv4 memory calculation: ... full_token=N"`,
	DPKey:       "dp_size",
	ServerPort:  "port",
	SharedPools: func(args map[string]string) bool { return args["enable_dp_attention"] == "True" },
	// With --enable-dp-attention SGLang runs all DP ranks in one torch
	// world and sizes each rank's pool from the free GPU memory
	// all-reduced to the minimum over that world (model_runner.py,
	// get_available_gpu_memory(distributed=True)), so the ranks' pools are
	// equal; only DP0 prints max_total_num_tokens. See
	// docs/reference/sglang-dp-attention.md.
	SharedPoolsWhy: "SGLang sizes every attention-DP rank's pool from one minimum over all ranks",
	MultiNodeKeys:  []string{"nnodes", "node_rank"},
}

var (

	// SGLang's header: "[2026-03-02 10:15:21.123 DP0 TP1] " with rank
	// tokens in any order (the order changed across versions). Searched
	// anywhere in the line, like vLLM's prefix.
	// SGLang 0.3 printed the time only ("[16:43:29 TP0] ").
	sglangHeaderRE = regexp.MustCompile(`\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d{1,6})?((?: [A-Za-z_]+\d+)*)\] ?`)
	// SGLang 0.2 tagged a worker's lines with its GPU: "[gpu=0] ".
	sglangGPUHeaderRE = regexp.MustCompile(`\[gpu=(\d+)\] ?`)
	// DeepSeek-V4's profiled pool: "..., full_token=5491200" (the fields
	// before it changed across versions).
	dsv4FullTokenRE = regexp.MustCompile(`[ ,]full_token=(\d+)(?:,|$)`)
)

// parseSGLang reads an SGLang segment: its header, found wherever it
// starts, and the message after it. p is the header's rank.
func parseSGLang(seg string) (enginelog.Event, enginelog.Proc, bool) {
	p := enginelog.NoProc()
	m := sglangHeaderRE.FindStringSubmatchIndex(seg)
	if m != nil {
		for _, tok := range strings.Fields(seg[m[2]:m[3]]) {
			p.Take(tok)
		}
	} else if m = sglangGPUHeaderRE.FindStringSubmatchIndex(seg); m != nil {
		// 0.2's GPU tag is the worker's GPU, a TP rank of DP rank 0 as far
		// as this log can tell.
		p.Take("TP" + seg[m[2]:m[3]])
	} else {
		return enginelog.Event{}, p, false
	}
	if p.Bad {
		return enginelog.Event{}, p, false
	}
	// SGLang adds a DP tag only when dp_size > 1.
	p.DPOnly = p.HasDP
	ev, ok := sglangMessage(seg[m[1]:])
	ev.DPRank, ev.TPRank, ev.DPNamed = p.DP, p.TP, p.DPOnly
	return ev, p, ok
}

func sglangMessage(msg string) (enginelog.Event, bool) {
	switch {
	case strings.HasPrefix(msg, "KV Cache is allocated. "):
		// MHA: ", K size: 1.65 GB, V size: 1.65 GB"; MLA: ", KV size: 160.63 GB".
		// 2026 names the dtype first: "dtype: torch.bfloat16, #tokens: N".
		// Requiring the comma keeps a line cut mid-number from counting.
		rest := msg[len("KV Cache is allocated. "):]
		if strings.HasPrefix(rest, "dtype: ") {
			_, rest, _ = strings.Cut(rest, ", ")
		}
		if !strings.HasPrefix(rest, "#tokens: ") {
			return enginelog.Event{}, false
		}
		n, rest, ok := enginelog.CutDigits(rest[len("#tokens: "):])
		if !ok || !strings.HasPrefix(rest, ",") {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatSGLangAlloc, KVTokens: n}, true
	case strings.HasPrefix(msg, "max_total_num_tokens="):
		n, rest, ok := enginelog.CutDigits(msg[len("max_total_num_tokens="):])
		if !ok || !strings.HasPrefix(rest, ",") {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatSGLangMaxTotal, KVTokens: n}, true
	case strings.HasPrefix(msg, "DSV4 pool sizes: full="):
		n, rest, ok := enginelog.CutDigits(msg[len("DSV4 pool sizes: full="):])
		if !ok || !strings.HasPrefix(rest, ",") {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatSGLangDSv4, KVTokens: n}, true
	case strings.HasPrefix(msg, "DSv4 memory calculation: "), strings.HasPrefix(msg, "DSV4 memory calculation: "):
		m := dsv4FullTokenRE.FindStringSubmatch(msg)
		if m == nil {
			return enginelog.Event{}, false
		}
		n, _, ok := enginelog.CutDigits(m[1])
		if !ok {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatSGLangDSv4Memory, KVTokens: n}, true
	case strings.HasPrefix(msg, "server_args={"):
		// 2026 SGLang prints its server args as a dict.
		return sglangArgs(enginelog.ArgsFromPyDict(msg[len("server_args="):], sglangModelKeys)), true
	case strings.HasPrefix(msg, "server_args=ServerArgs("):
		return sglangArgs(enginelog.ArgsFromPyCall(msg[len("server_args="):], sglangModelKeys)), true
	case strings.HasPrefix(msg, "The server is fired up and ready to roll!"):
		return enginelog.Event{Kind: enginelog.EventReady}, true
	}
	return enginelog.Event{}, false
}

// sglangArgs takes the version from the server args, where they name one.
func sglangArgs(ev enginelog.Event) enginelog.Event {
	for _, k := range []string{"version", "sglang_version"} {
		if v := ev.Args[k]; v != "" && v != "None" {
			ev.Version = v
			break
		}
	}
	return ev
}

// Launch-arg keys that name the served model, best first.
var sglangModelKeys = []string{"served_model_name", "model_path"}
