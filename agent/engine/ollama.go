package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"heft/shared/wire"
)

// Ollama (reference/engines.md §5): /api/version (also its readiness: it
// has no /health), and /api/ps for the loaded models and their context
// length. It serves many models, exposes no request counts, and cannot be
// told an exact output length.
var ollama = descriptor{
	name:     wire.EngineOllama,
	port:     11434,
	programs: []string{"ollama"},
	health:   "/api/version",
	output:   OutputForm{Exact: false},
	// max_tokens caps the answer at one token; there is no tokenizer
	// endpoint, and the model's context is /api/ps' context_length (read
	// by the adapter).
	prefill: OutputForm{Exact: false},
	detect:  detection{probes: []probe{{"/api/version", []string{"version"}}}},
	running: ollamaRunning,
	adapter: ollamaAdapter{},
	log:     &ollamaLog,
}

// ollamaRunning reads OLLAMA_NUM_PARALLEL from the server's environment
// (default 1); unknown when that environment cannot be read.
func ollamaRunning(in runningInput) (int, string) {
	v, ok, err := in.env("OLLAMA_NUM_PARALLEL")
	switch {
	case err != nil:
		return 0, ""
	case !ok:
		return 1, runningFromDefault + " 1 (OLLAMA_NUM_PARALLEL is not set)"
	}
	n, perr := strconv.Atoi(strings.TrimSpace(v))
	if perr != nil || n <= 0 || n > wire.MaxRunning {
		return 0, ""
	}
	return n, fmt.Sprintf("%s OLLAMA_NUM_PARALLEL=%d", runningFromEnv, n)
}

type ollamaAdapter struct{}

func (ollamaAdapter) read(ctx context.Context, c *Client, r *reading) {
	v, err := c.version(ctx, "/api/version")
	r.note(err)
	r.version = v
	if r.down {
		return
	}
	ps, err := c.ollamaPS(ctx)
	r.note(err)
	if len(ps) > 0 {
		r.served = ps[0].Name
	}
	for _, m := range ps {
		if (c.cfg.Model == "" || m.Name == c.cfg.Model) && m.ContextLength > 0 {
			r.pools, r.poolsSrc = []wire.Rank{{DPRank: 0, KVTokens: m.ContextLength}}, SourceAPIPS
			r.maxModelLen, r.maxModelLenSrc = m.ContextLength, SourceAPIPS
			break
		}
	}
}

func (ollamaAdapter) load(context.Context, *Client) (wire.Load, error) { return wire.Load{}, nil }

// ollamaModel is one model Ollama has loaded.
type ollamaModel struct {
	Name          string
	ContextLength int64
	SizeVRAM      int64
}

func (c *Client) ollamaPS(ctx context.Context) ([]ollamaModel, error) {
	var resp struct {
		Models []struct {
			Name          string  `json:"name"`
			Model         string  `json:"model"`
			SizeVRAM      float64 `json:"size_vram"`
			ContextLength float64 `json:"context_length"`
		} `json:"models"`
	}
	if err := c.getJSON(ctx, "/api/ps", &resp); err != nil {
		return nil, err
	}
	var out []ollamaModel
	for _, m := range resp.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		if name == "" || len(out) >= wire.MaxListItems {
			continue
		}
		out = append(out, ollamaModel{Name: bound(name), ContextLength: tokens(m.ContextLength), SizeVRAM: tokens(m.SizeVRAM)})
	}
	return out, nil
}
