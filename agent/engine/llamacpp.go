package engine

import (
	"context"
	"errors"
	"fmt"

	"heft/shared/wire"
)

// llama.cpp's llama-server (reference/engines.md §4): /props for the
// model alias, build and slots × context per slot, /slots for the busy
// slots (on unless --no-slots), /metrics with --metrics, unlabelled. It
// takes n_predict with ignore_eos for an exact length.
var llamaCpp = descriptor{
	name:     wire.EngineLlamaCpp,
	port:     8080,
	programs: []string{"llama-server", "llama_server"},
	health:   "/health",
	metrics: &metricNames{
		running:           []string{"llamacpp:requests_processing"},
		waiting:           []string{"llamacpp:requests_deferred"},
		kvUsage:           []string{"llamacpp:kv_cache_usage_ratio"},
		generated:         []string{"llamacpp:tokens_predicted_total"},
		generatedAtFinish: true,
		// Both counters grow when a request finishes (on_prediction).
		decodeSeconds: []string{"llamacpp:tokens_predicted_seconds_total"},
		// Prompt tokens evaluated: a cached prefix is not among them.
		prompt: []string{"llamacpp:prompt_tokens_total"},
	},
	output: OutputForm{Exact: true, Fields: func(n int) map[string]any {
		return map[string]any{"n_predict": n, "ignore_eos": true}
	}},
	prefill: OutputForm{Exact: true, Fields: func(n int) map[string]any {
		return map[string]any{"n_predict": n, "ignore_eos": true}
	}},
	// POST /tokenize counts {"content"} without the chat template and
	// answers the tokens themselves.
	tokenize: &Tokenizer{Path: "/tokenize", Count: countField, Body: func(_, text string) map[string]any {
		return map[string]any{"content": text}
	}},
	// A request runs in one slot: the maximum model length is a slot's
	// n_ctx from /props (read by the adapter), not --ctx-size, which all
	// slots share.
	detect: detection{ownedBy: "llamacpp",
		probes: []probe{{"/props", []string{"default_generation_settings", "total_slots"}}}},
	running: llamaRunning,
	adapter: llamaAdapter{},
	log:     &llamaCppLog,
}

// llamaRunning reads --parallel (-np) when /props did not say total_slots.
func llamaRunning(in runningInput) (int, string) {
	n, src, _ := positiveArg(in.args, "parallel")
	return n, src
}

type llamaAdapter struct{}

func (a llamaAdapter) read(ctx context.Context, c *Client, r *reading) {
	props, err := c.llamaProps(ctx)
	r.note(err)
	if err == nil {
		r.version, r.served = props.BuildInfo, props.ModelAlias
		if props.TotalSlots > 0 {
			r.running, r.runningSrc = int(min(props.TotalSlots, wire.MaxRunning)), SourceProps+" total_slots"
		}
		if p := props; p.NCtx > 0 && p.TotalSlots > 0 && p.NCtx <= maxKVTokens/p.TotalSlots {
			r.pools, r.poolsSrc = []wire.Rank{{DPRank: 0, KVTokens: p.NCtx * p.TotalSlots}}, SourceProps
		}
		if props.NCtx > 0 {
			r.maxModelLen, r.maxModelLenSrc = props.NCtx, SourceProps
		}
	}
	if r.down {
		return
	}
	l, err := a.load(ctx, c)
	r.note(err)
	r.load = l
}

// load counts busy slots in /slots, or reads /metrics where slots are off.
func (llamaAdapter) load(ctx context.Context, c *Client) (wire.Load, error) {
	l, err := c.llamaSlots(ctx)
	if err == nil || !errors.Is(err, errNotServed) {
		return l, err
	}
	mf, merr := c.scrape(ctx)
	if merr != nil {
		if errors.Is(merr, errNotServed) {
			return wire.Load{}, fmt.Errorf("llama-server serves neither /slots nor /metrics; start it with --slots or --metrics (%w)", errNotServed)
		}
		return wire.Load{}, merr
	}
	return mf.LoadOf()
}

// llamaProps is the part of llama-server's /props heft reads.
type llamaProps struct {
	NCtx       int64 // per slot
	TotalSlots int64
	ModelAlias string
	ModelPath  string
	BuildInfo  string
}

func (c *Client) llamaProps(ctx context.Context) (llamaProps, error) {
	var resp struct {
		DefaultGenerationSettings struct {
			NCtx float64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots float64 `json:"total_slots"`
		ModelAlias string  `json:"model_alias"`
		ModelPath  string  `json:"model_path"`
		BuildInfo  string  `json:"build_info"`
	}
	if err := c.getJSON(ctx, "/props", &resp); err != nil {
		return llamaProps{}, err
	}
	return llamaProps{NCtx: tokens(resp.DefaultGenerationSettings.NCtx), TotalSlots: tokens(resp.TotalSlots),
		ModelAlias: bound(resp.ModelAlias), ModelPath: bound(resp.ModelPath), BuildInfo: bound(resp.BuildInfo)}, nil
}

// llamaSlots counts busy slots in /slots.
func (c *Client) llamaSlots(ctx context.Context) (wire.Load, error) {
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	if err := c.getJSON(ctx, "/slots", &slots); err != nil {
		return wire.Load{}, err
	}
	busy := 0
	for _, s := range slots {
		if s.IsProcessing {
			busy++
		}
	}
	return wire.Load{Known: true, Running: busy, Ranks: []wire.RankLoad{{DPRank: 0, Running: busy}}}, nil
}
