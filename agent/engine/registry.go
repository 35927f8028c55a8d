package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"heft/agent/engine/launch"
	"heft/agent/enginelog"
	"heft/shared/wire"
)

// The engine kinds heft knows, one file each (vllm.go, sglang.go, ...).
// A new kind is a new file with its descriptor and adapter, one line
// here, and its name in wire.EngineKinds (the coordinator checks it).
//
// The order is Detect's: a kind whose probe another kind's server also
// answers comes after that kind, and mlx-lm's server, which has nothing
// of its own, comes last.
var registry = []*descriptor{&ollama, &sglang, &llamaCpp, &vllm, &mlx}

// descriptor is everything heft knows about one engine kind.
type descriptor struct {
	// name is the kind as the config, the CLI and the wire write it.
	name string
	// port is where the engine listens unless told otherwise.
	port int
	// programs are words of a command line that launches the kind: a
	// program or Python module name, or part of one.
	programs []string
	// health answers 200 once the engine is ready (503 while it loads).
	health string
	// metrics names the kind's /metrics series; nil: it has no /metrics.
	metrics *metricNames
	// output is how a chat request asks for an exact output length.
	output OutputForm
	// prefill is how a prefill request (a long prompt) asks for its one
	// output token.
	prefill OutputForm
	// tokenize is the kind's tokenizer endpoint; nil for none.
	tokenize *Tokenizer
	// context says where the kind tells its maximum model length, besides
	// what its adapter reads from its own endpoints.
	context contextSource
	// detect tells the kind from the others.
	detect detection
	// modelFromCmdline: the served model is the --model launch argument,
	// not the first of /v1/models (mlx-lm lists its whole Hugging Face
	// cache there).
	modelFromCmdline bool
	// running reads how many sequences one data-parallel rank runs at
	// once from the launch arguments, the process environment or the
	// kind's default, and says where from; 0 when unknown. nil: never
	// known beyond what the adapter reads from the engine's endpoints.
	running func(in runningInput) (perRank int, src string)
	// adapter reads what only this kind serves.
	adapter adapter
	// log is the grammar of the kind's start-up log; nil: heft reads none.
	log *enginelog.Grammar
}

// adapter is the part of a Client's work that differs by kind.
type adapter interface {
	// read asks the kind's own endpoints, after the models and health
	// endpoints every kind serves, and records what it learns in r. It
	// stops as soon as r.down.
	read(ctx context.Context, c *Client, r *reading)
	// load reads how busy the engine is, cheaply: wire.Load with Known
	// false and no error for a kind that does not say.
	load(ctx context.Context, c *Client) (wire.Load, error)
}

// OutputForm is how a chat completion request asks one engine kind for n
// output tokens (reference/engines.md §6, "exact length").
type OutputForm struct {
	// Exact is false for a kind that takes max_tokens only as a cap: its
	// answers may stop short, and a probe of it is never Complete.
	Exact bool
	// Fields returns what a request adds to max_tokens = n, nil for none.
	Fields func(n int) map[string]any
	// ContinuousUsage: the kind puts the tokens made so far in every
	// streamed chunk when asked (stream_options.continuous_usage_stats),
	// so a probe counts tokens as they arrive even where speculative
	// decoding streams several in one chunk.
	ContinuousUsage bool
}

// contextSource is where a kind tells its maximum model length.
type contextSource struct {
	// models: /v1/models lists max_model_len per model.
	models bool
	// args are the normalised launch arguments that set it.
	args []string
}

// Tokenizer is a kind's endpoint that counts a prompt's tokens: the
// prefill probe counts its prompts with it when usage does not say.
type Tokenizer struct {
	Path string
	// Chat is true when the count includes the chat template, so that it
	// equals usage.prompt_tokens for the same messages; false when it
	// counts the text alone.
	Chat bool
	// Body is the request that counts one user message of text.
	Body func(model, text string) map[string]any
	// Count reads the count from the answer.
	Count func(answer []byte) (int, error)
}

// anyKind is the output form for an engine of unknown kind: every length
// field any kind honours.
var anyKind = OutputForm{Exact: true, Fields: func(n int) map[string]any {
	return map[string]any{"min_tokens": n, "n_predict": n, "ignore_eos": true}
}}

// detection is how Detect recognises a kind.
type detection struct {
	// ownedBy is the owned_by of the kind's /v1/models entries, when it
	// writes its own name there.
	ownedBy string
	// probes are endpoints only this kind serves, each with keys its JSON
	// object holds.
	probes []probe
	// fallback: the kind is whatever answers /v1/models and a health
	// object {"status": "ok"} but none of the probes (mlx-lm).
	fallback bool
}

type probe struct {
	path string
	keys []string
}

// lookup returns the descriptor of a kind.
func lookup(kind string) (*descriptor, bool) {
	i := slices.IndexFunc(registry, func(d *descriptor) bool { return d.name == kind })
	if i < 0 {
		return nil, false
	}
	return registry[i], true
}

// checkKind returns the descriptor of a kind, lower-cased and trimmed,
// or an error that lists the kinds.
func checkKind(kind string) (*descriptor, error) {
	d, ok := lookup(strings.ToLower(strings.TrimSpace(kind)))
	if !ok {
		return nil, fmt.Errorf("engine kind %q is not one of %s", kind, strings.Join(wire.EngineKinds, ", "))
	}
	return d, nil
}

// Known reports whether kind names an engine kind heft can read.
func Known(kind string) bool {
	_, ok := lookup(kind)
	return ok
}

// OutputFor returns how to ask an engine of the given kind for an exact
// output length; "" is an engine of unknown kind, sent every length field.
func OutputFor(kind string) (OutputForm, error) {
	if kind == "" {
		return anyKind, nil
	}
	d, ok := lookup(kind)
	if !ok {
		return OutputForm{}, fmt.Errorf("engine kind %q is not one of %s", kind, strings.Join(wire.EngineKinds, ", "))
	}
	return d.output, nil
}

// PrefillFor returns how to ask an engine of the given kind for the one
// output token of a prefill request, and its tokenizer endpoint (nil when
// it has none); "" is an engine of unknown kind, sent every length field,
// with no tokenizer.
func PrefillFor(kind string) (OutputForm, *Tokenizer, error) {
	if kind == "" {
		return anyKind, nil, nil
	}
	d, ok := lookup(kind)
	if !ok {
		return OutputForm{}, nil, fmt.Errorf("engine kind %q is not one of %s", kind, strings.Join(wire.EngineKinds, ", "))
	}
	return d.prefill, d.tokenize, nil
}

// countField reads {"count": n} or, failing that, the length of
// {"tokens": [...]}: the answers of vLLM's, SGLang's and llama.cpp's
// /tokenize.
func countField(answer []byte) (int, error) {
	var resp struct {
		Count  *float64          `json:"count"`
		Tokens []json.RawMessage `json:"tokens"`
	}
	if looksLikeHTML(answer) {
		return 0, errors.New("the tokenizer answered HTML, not JSON")
	}
	if err := json.Unmarshal(answer, &resp); err != nil {
		return 0, fmt.Errorf("the tokenizer's answer is not the expected JSON: %v", err)
	}
	switch {
	case resp.Count != nil && *resp.Count >= 0 && *resp.Count <= maxKVTokens:
		return int(*resp.Count), nil
	case resp.Count == nil && resp.Tokens != nil:
		return len(resp.Tokens), nil
	}
	return 0, errors.New("the tokenizer's answer holds no token count")
}

// Port is a default engine port and the kinds that listen there.
type Port struct {
	Port  int
	Kinds []string
}

// DefaultPorts lists where each kind listens unless told otherwise: the
// ports in the order of wire.EngineKinds, the kinds on one port in
// Detect's order. llama-server and mlx-lm's server share 8080; Detect
// tells them apart.
func DefaultPorts() []Port {
	var out []Port
	for _, name := range wire.EngineKinds {
		d, ok := lookup(name)
		if !ok || slices.ContainsFunc(out, func(p Port) bool { return p.Port == d.port }) {
			continue
		}
		p := Port{Port: d.port}
		for _, k := range registry {
			if k.port == d.port {
				p.Kinds = append(p.Kinds, k.name)
			}
		}
		out = append(out, p)
	}
	return out
}

// simulator launches heft's own simulated engine, which serves as any kind.
const simulator = "heft-sim"

// looksLikeEngine reports whether a command line launches one of the
// engines heft knows (directly, or through python -m or a script).
func looksLikeEngine(argv []string) bool {
	prog := launch.Program(argv)
	if prog == "" {
		return false
	}
	if strings.Contains(prog, simulator) {
		return true
	}
	return slices.ContainsFunc(registry, func(d *descriptor) bool {
		return slices.ContainsFunc(d.programs, func(w string) bool { return strings.Contains(prog, w) })
	})
}

// launchesEngine is looksLikeEngine for a command line that also carries
// arguments to read: the process to take as the engine's root.
func launchesEngine(argv []string) bool {
	return looksLikeEngine(argv) && len(launch.FromCmdline(argv)) > 0
}
