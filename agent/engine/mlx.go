package engine

import (
	"context"

	"heft/shared/wire"
)

// mlx-lm's server (reference/engines.md §3): /v1/models lists the whole
// Hugging Face cache, so the served model is its --model argument; no
// /metrics, no load, no KV pool (allocated per request), and no length
// control beyond a cap. Nothing it serves is its own, so Detect knows it
// only as the last resort.
var mlx = descriptor{
	name:     wire.EngineMLX,
	port:     8080,
	programs: []string{"mlx_lm"},
	health:   "/health",
	output:   OutputForm{Exact: false},
	// No tokenizer endpoint and no stated context: its KV cache grows per
	// request, so heft cannot say what one request can hold.
	prefill:          OutputForm{Exact: false},
	detect:           detection{fallback: true},
	modelFromCmdline: true,
	running:          mlxRunning,
	adapter:          mlxAdapter{},
}

// mlxRunning reads --decode-concurrency (default 32).
func mlxRunning(in runningInput) (int, string) {
	if n, src, ok := positiveArg(in.args, "decode_concurrency"); ok {
		return n, src
	}
	return 32, runningFromDefault + " 32"
}

type mlxAdapter struct{}

func (mlxAdapter) read(context.Context, *Client, *reading) {}

func (mlxAdapter) load(context.Context, *Client) (wire.Load, error) { return wire.Load{}, nil }
