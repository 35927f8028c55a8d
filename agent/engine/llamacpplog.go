package engine

import (
	"regexp"
	"strconv"
	"strings"

	"heft/agent/enginelog"
	"heft/shared/wire"
)

// llama.cpp's llama-server and Ollama (whose runner is llama.cpp's, or its
// own engine logging the same way) run one pool: DP rank 0. Their lines
// (reference/engines.md §4 and §5):
//
//	llama_kv_cache: size =  224.00 MiB (  4096 cells,  28 layers,  1/1 seqs), K (f16): ...
//	llama_context: n_ctx         = 4096            (older: llama_new_context_with_model: n_ctx = 4096)
//	time=... level=INFO source=server.go:... msg="starting llama server" cmd="... --ctx-size 8192 ..."
//	main: server is listening on http://127.0.0.1:8080 - starting the main loop
//	0.09.390.156 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 16384, kv_unified = 'true'   (2026, all the default verbosity shows)
//	0.09.409.230 I srv  llama_server: model loaded
//	time=... msg="llama runner started in 2.51 seconds"
//	time=... msg="Listening on 127.0.0.1:11434 (version 0.6.2)"
//	build: 5123 (5f1d2e3a) with cc ...
const (
	// FormatLlamaISWABase is the full-attention cache of a model with
	// sliding-window layers (gemma 3, gpt-oss): llama.cpp prints one
	// "llama_kv_cache: size = ... (N cells" line for it and another, far
	// smaller, for the sliding-window cache, so this line names the pool.
	// Its N is one stream's cells (kv_size), and it does not say how many
	// streams a split cache keeps: the full cache's own size line, which
	// follows it with the same N, does (enginelog.Grammar.PerStream).
	FormatLlamaISWABase = "llamacpp-iswa-base-cells"
	// FormatLlamaKVCells is llama.cpp's KV cache line: its cells (one
	// stream's) times the streams its "A/S seqs" names are the pool's
	// tokens, over all slots.
	FormatLlamaKVCells = "llamacpp-kv-cells"
	// FormatLlamaNCtx is the context's n_ctx, the same total (older builds
	// print no cells).
	FormatLlamaNCtx = "llamacpp-n-ctx"
	// FormatOllamaCtxSize is the --ctx-size Ollama started its runner with.
	FormatOllamaCtxSize = "ollama-ctx-size"
	// FormatLlamaSlots is the server's slots line, "load_model:
	// initializing, n_slots = N, n_ctx_slot = M, kv_unified = 'B'": with
	// a unified cache every slot may fill the one pool of M tokens,
	// without one each slot holds its own M, N × M in all. From 2026 it is
	// the only pool line llama-server prints at its default verbosity
	// (the context and cache lines need -lv 4), so the last choice. A
	// build that caps a slot at the model's training context prints the
	// capped M.
	FormatLlamaSlots = "llamacpp-slots"
)

var (
	// What may come before a llama.cpp message: newer llama-server's time
	// since start and level ("0.19.914.972 I llama_kv_cache_iswa: ..."),
	// or the level alone (--log-prefix without timestamps), after any run
	// of digits, spaces and date or time punctuation a wrapper heft does
	// not know put first ("2026-05-14 22:14:31.035 | llama_kv_cache: ...").
	// Letters end the run, so text inside a message (a request body the
	// server logs) never reads as a line of its own; so does "[", so a
	// router's "[port] " child lines, each another server's, are not read.
	// Two wrappers with letters are taken off first: a journald or syslog
	// prefix whose identifier carries a pid ("Feb 27 11:23:59 host
	// ollama[26115]: ", a journal exported to a file and read inside
	// another wrapper) and docker compose's service column ("ollama-2  | ").
	llamaPrefixRE = regexp.MustCompile(`^\s*(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? (?:\S+ )?[^\s\[\]:]+\[\d+\]: |[A-Za-z0-9][\w.-]* +\| )?[\d :.,/|-]*(?:[IWEDT] )?`)
	// The cache's size line: its cells, and from 2025 "N/S seqs", S the
	// streams it keeps. A split (non-unified) cache gives each of its S
	// slots a stream of the cells, so the pool is cells × S.
	llamaCellsRE = regexp.MustCompile(`\(\s*(\d+) cells,(?:\s*\d+ layers,\s*\d+/(\d+) seqs)?`)
	// A sliding-window model's full cache: llama_kv_cache_iswa, or
	// llama_kv_cache_unified_iswa in earlier 2025 builds.
	llamaISWARE  = regexp.MustCompile(`^llama_kv_cache(?:_unified)?_iswa: creating non-SWA KV cache, size = (\d+) cells`)
	llamaNCtxRE  = regexp.MustCompile(`^(?:llama_context|llama_new_context_with_model): n_ctx\s+=\s+(\d+)\s*$`)
	llamaBuildRE = regexp.MustCompile(`^build: (\d+) \(`)
	// The server's slots line and, from 2026, its ready lines, after the
	// module tag newer builds print ("srv    load_model: ...").
	llamaSlotsRE = regexp.MustCompile(`^(?:srv\s+)?load_model: initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'`)
	// "model loaded" is logged once the server answers requests; a
	// model server's (not a router's) "listening on" line follows it.
	llamaReadyRE = regexp.MustCompile(`^(?:srv\s+)?(?:main|llama_server): (?:model loaded$|(?:server is )?listening on https?://)`)
	// The runner's context over all its slots: --ctx-size (to 2025), "-c"
	// (2026's llama-server runner) or the committed load request's KvSize.
	ollamaCtxRE = regexp.MustCompile(`(?:^|\s)(?:--ctx-size|-c)\s+(\d+)(?:\s|"|$)|[{ ]KvSize:(\d+)[ }]`)
	// The lines on which Ollama gives a model's runner its KV size: the
	// runner's command line, "starting llama server" (to 2025) or
	// "starting runner" with the model (2026; without --model it is a GPU
	// discovery runner, and from 2026 the size is not on it), the load
	// request it commits (2026: "load request="{Operation:commit ...
	// KvSize:16384 ...}"; the fit and alloc requests before it may try
	// other sizes), and from mid-2026 "starting llama-server", llama.cpp's
	// own server as the runner.
	ollamaSizeLineRE = regexp.MustCompile(`msg="starting llama(?: |-)server"|msg="starting runner" cmd="[^"]* --model |msg=load request="\{Operation:commit `)
	ollamaVerRE      = regexp.MustCompile(`msg="Listening on \S+ \(version ([^)\s]+)\)"`)
	// Ollama's runner is loaded ("llama runner started in 2.51 seconds";
	// 2026's llama-server runner: "llama-server started in 36.45 seconds";
	// 2024: "Starting llama main loop"); 2024 llama-server's JSON log says
	// "model loaded".
	ollamaLoadedRE = regexp.MustCompile(`msg="(?:llama runner started in |llama-server started in |Starting llama main loop")|"(?:message|msg)":"model loaded"`)
)

// llamaCppLog is llama.cpp's log grammar, ollamaLog Ollama's: one pool,
// rank 0.
var (
	llamaCppLog = llamaGrammar(wire.EngineLlamaCpp, FormatLlamaISWABase, FormatLlamaKVCells, FormatLlamaNCtx, FormatLlamaSlots)
	// The cells are what the cache holds; n_ctx is asked for; --ctx-size
	// is what Ollama asked its runner for.
	ollamaLog = ollamaGrammar()
)

// ollamaGrammar is llama.cpp's grammar plus Ollama's own pool: the
// --ctx-size it starts a runner with (the runner sizes its KV cache to it,
// over all --parallel slots), which is all an Ollama-engine runner shows.
func ollamaGrammar() enginelog.Grammar {
	g := llamaGrammar(wire.EngineOllama, FormatLlamaISWABase, FormatLlamaKVCells, FormatLlamaNCtx, FormatOllamaCtxSize, FormatLlamaSlots)
	g.CommandLine = func(line string) (enginelog.Event, bool) {
		if !ollamaSizeLineRE.MatchString(line) {
			return enginelog.Event{}, false
		}
		n, err := strconv.ParseInt(ollamaCtxSize(line), 10, 64)
		if err != nil {
			return enginelog.Event{}, false
		}
		return enginelog.Event{Kind: enginelog.EventPool, Format: FormatOllamaCtxSize, KVTokens: n, TPRank: -1}, true
	}
	g.PoolLines += `, or Ollama's runner's "--ctx-size N" or load request's "KvSize:N"`
	return g
}

// ollamaCtxSize is the KV size an Ollama line gives its runner, "" for none.
func ollamaCtxSize(line string) string {
	m := ollamaCtxRE.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	return m[1] + m[2]
}

func llamaGrammar(kind string, formats ...string) enginelog.Grammar {
	return enginelog.Grammar{
		Kind: kind,
		Segment: func(seg string, _ bool, _ *enginelog.Proc) (enginelog.Event, enginelog.Proc, bool) {
			ev, ok := parseLlama(seg)
			return ev, enginelog.NoProc(), ok
		},
		Formats:   formats,
		PerStream: []string{FormatLlamaISWABase},
		PoolLines: `llama.cpp and Ollama "llama_kv_cache_iswa: creating non-SWA KV cache, size = N cells", ` +
			`"llama_kv_cache: size = ... (N cells, ...", "n_ctx = N" and "load_model: initializing, n_slots = N, n_ctx_slot = M, kv_unified = ..."`,
		DPKey: "data_parallel_size", // never printed: one rank
	}
}

// parseLlama reads a llama.cpp or Ollama line.
func parseLlama(seg string) (enginelog.Event, bool) {
	if m := llamaPrefixRE.FindStringIndex(seg); m != nil {
		seg = seg[m[1]:]
	}
	ev := enginelog.Event{TPRank: -1}
	switch {
	case strings.HasPrefix(seg, "llama_kv_cache") && strings.Contains(seg, "_iswa: creating non-SWA KV cache"):
		if m := llamaISWARE.FindStringSubmatch(seg); m != nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil && n <= maxCells {
				ev.Kind, ev.Format, ev.KVTokens = enginelog.EventPool, FormatLlamaISWABase, n
				return ev, true
			}
		}
	case strings.HasPrefix(seg, "llama_kv_cache") && strings.Contains(seg, " cells,"):
		if cells, streams, ok := llamaCacheCells(seg); ok {
			ev.Kind, ev.Format, ev.KVTokens = enginelog.EventPool, FormatLlamaKVCells, cells*streams
			ev.Cells, ev.Streams = cells, streams
			return ev, true
		}
	case strings.Contains(seg, ": n_ctx "):
		if m := llamaNCtxRE.FindStringSubmatch(seg); m != nil {
			if n, err := strconv.ParseInt(m[1], 10, 64); err == nil {
				ev.Kind, ev.Format, ev.KVTokens = enginelog.EventPool, FormatLlamaNCtx, n
				return ev, true
			}
		}
	case strings.Contains(seg, `msg="starting llama server"`), strings.Contains(seg, `msg="starting llama-server"`),
		strings.Contains(seg, `msg="starting runner"`) && strings.Contains(seg, " --model "):
		// Ollama starts a runner per model load: a new start-up.
		ev.Kind, ev.Args = enginelog.EventLaunchArgs, map[string]string{}
		if n := ollamaCtxSize(seg); n != "" {
			ev.Args["ctx_size"] = n
		}
		return ev, true
	case strings.Contains(seg, "load_model: initializing, n_slots = "):
		if n, ok := llamaSlotsPool(seg); ok {
			ev.Kind, ev.Format, ev.KVTokens = enginelog.EventPool, FormatLlamaSlots, n
			return ev, true
		}
	case strings.Contains(seg, "server is listening on ") && strings.HasSuffix(seg, "starting the main loop"),
		ollamaLoadedRE.MatchString(seg), llamaReadyRE.MatchString(seg):
		ev.Kind = enginelog.EventReady
		return ev, true
	case strings.HasPrefix(seg, "build: "):
		if m := llamaBuildRE.FindStringSubmatch(seg); m != nil {
			ev.Kind, ev.Version = enginelog.EventVersion, "b"+m[1]
			return ev, true
		}
	case strings.Contains(seg, `msg="Listening on `):
		if m := ollamaVerRE.FindStringSubmatch(seg); m != nil {
			ev.Kind, ev.Version = enginelog.EventVersion, m[1]
			return ev, true
		}
	}
	return enginelog.Event{}, false
}

// maxCells bounds a cell count read from a cache line.
const maxCells = 1 << 40

// llamaCacheCells reads a cache size line: one stream's cells and the
// streams it names (one where it names none, as before 2025); the pool is
// their product.
func llamaCacheCells(seg string) (cells, streams int64, ok bool) {
	m := llamaCellsRE.FindStringSubmatch(seg)
	if m == nil {
		return 0, 0, false
	}
	cells, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || cells > maxCells {
		return 0, 0, false
	}
	if m[2] == "" {
		return cells, 1, true
	}
	streams, err = strconv.ParseInt(m[2], 10, 64)
	if err != nil || streams < 1 || streams > 1<<16 {
		return 0, 0, false
	}
	return cells, streams, true
}

// llamaSlotsPool is the pool the server's slots line gives: n_ctx_slot
// for a unified cache, n_slots × n_ctx_slot for one split among the slots.
func llamaSlotsPool(seg string) (int64, bool) {
	m := llamaSlotsRE.FindStringSubmatch(seg)
	if m == nil {
		return 0, false
	}
	slots, err1 := strconv.ParseInt(m[1], 10, 64)
	perSlot, err2 := strconv.ParseInt(m[2], 10, 64)
	if err1 != nil || err2 != nil || slots < 1 || slots > 1<<20 || perSlot > 1<<40 {
		return 0, false
	}
	if m[3] == "true" {
		return perSlot, true
	}
	return slots * perSlot, true
}
