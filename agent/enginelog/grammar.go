package enginelog

import "strings"

// grammar is one engine kind's log grammar: how its lines name ranks and
// what they say. Each kind's lives in its own file (vllm.go, sglang.go,
// llamacpp.go); the reader and the tracker only look them up, so a new
// kind is a new file and a row in grammars.
type grammar struct {
	// segment reads one '\r'-separated segment of a line. first is set
	// for the line's first segment; line is the rank state shared by the
	// line's segments (vLLM names the process at a line's start only).
	segment func(seg string, first bool, line *proc) (Event, proc, bool)
	// formats are the kind's pool formats, best first: lines of several
	// formats for one rank give the best one's figure.
	formats []string
	// dpKey is the launch argument that gives the data-parallel size.
	dpKey string
	// serverPort, when set, is the launch argument naming the server's
	// port: launch args with another port in one start-up are another
	// server in the same log, not a restart.
	serverPort string
	// sharedPools tells, from the launch args, whether the engine sizes
	// every DP rank's pool together, so a rank that printed none holds
	// what the others printed (see sharedAttentionPools).
	sharedPools func(args map[string]string) bool
	// mistaken is the kind whose logs are most often read with this
	// kind's name, for the "try engine ..." hint; "" for none.
	mistaken string
}

// grammars are the kinds whose logs enginelog reads.
var grammars = map[string]grammar{
	kindVLLM:     vllmGrammar,
	kindSGLang:   sglangGrammar,
	kindLlamaCpp: llamaGrammar(kindLlamaCpp),
	kindOllama:   llamaGrammar(kindOllama),
}

// grammarOf finds a kind's grammar, case and spaces aside.
func grammarOf(kind string) (string, grammar, bool) {
	k := strings.ToLower(strings.TrimSpace(kind))
	g, ok := grammars[k]
	return k, g, ok
}
