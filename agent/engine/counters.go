package engine

import (
	"context"
	"errors"
	"fmt"

	"heft/shared/wire"
)

// Counters is one reading of an engine's own /metrics: the tokens it has
// generated since it started and how busy it is now. The probe reads it
// around its measured burst to tell whether other traffic shared the
// engine; read twice, some time apart, it is what the engine delivered
// in between.
type Counters struct {
	// Generated is the generated-tokens counter over every rank, and
	// GeneratedLive whether it moves as tokens are made
	// (MetricsFacts.GeneratedLive).
	Generated     float64
	GeneratedLive bool
	// Ranks is the counter per data-parallel rank where the engine
	// labels it by rank; otherwise rank 0 holds the total.
	Ranks map[int]float64
	// Load is the running and waiting requests, per rank where labelled.
	Load wire.Load
	// InterTokenSeconds and InterTokens are the engine's inter-token
	// latency histogram's sum and count over every rank (vLLM, SGLang), or
	// its finished requests' decode seconds and tokens (llama.cpp), where
	// InterTokenKnown.
	InterTokenSeconds, InterTokens float64
	InterTokenKnown                bool
	// FirstTokens is MetricsFacts.FirstTokens, where FirstTokensKnown.
	FirstTokens      float64
	FirstTokensKnown bool
	// InterTokenLive is MetricsFacts.InterTokenLive: the histogram's sum
	// over a span, over its length, is the requests decoding in it.
	InterTokenLive bool
	// PromptComputed is the prompt tokens read less the prefix cache's
	// hits, where PromptKnown.
	PromptComputed float64
	PromptKnown    bool
}

// Counters scrapes /metrics for the generated-tokens counter and the
// load (the live one where the kind's gauges are late: SGLang's). Kinds
// without /metrics (mlx-lm, Ollama) give ErrNoMetrics; a page without the
// counter (an engine started without metrics, or too old) an error saying
// so.
func (c *Client) Counters(ctx context.Context) (Counters, error) {
	if c.kind.metrics == nil {
		return Counters{}, fmt.Errorf("%s: %w", c.kind.name, ErrNoMetrics)
	}
	mf, err := c.scrape(ctx)
	if err != nil {
		return Counters{}, err
	}
	if !mf.GeneratedKnown {
		return Counters{}, fmt.Errorf("%s /metrics has no %s", c.kind.name, c.kind.metrics.generated[0])
	}
	load := mf.Load
	if live := c.kind.metrics.liveLoad; live != nil {
		if l, ok := live(ctx, c); ok {
			load = withKVUsage(l, mf.Load)
		}
	}
	return Counters{Generated: mf.Generated, GeneratedLive: mf.GeneratedLive, Ranks: mf.GeneratedRanks, Load: load,
		InterTokenSeconds: mf.InterTokenSeconds, InterTokens: mf.InterTokens, InterTokenKnown: mf.InterTokenKnown,
		InterTokenLive: mf.InterTokenLive, FirstTokens: mf.FirstTokens, FirstTokensKnown: mf.FirstTokensKnown,
		PromptComputed: mf.PromptComputed, PromptKnown: mf.PromptKnown}, nil
}

// Stir is what moves at every step of an engine with requests running:
// its generated and prompt tokens together. live is false where the
// kind's counters move only as requests finish (GeneratedLive).
func (c Counters) Stir() (stir float64, live bool) {
	return c.Generated + c.PromptComputed, c.GeneratedLive
}

// ErrCountersAtFinish: the kind's counters move only as requests finish
// (llama.cpp's), so their standing still says nothing of its load.
var ErrCountersAtFinish = errors.New("its token counters move only as requests finish")

// Stir reads what moves at every step of an engine that has requests
// running: its generated and prompt tokens together. Kinds whose counters
// move only as requests finish give ErrCountersAtFinish.
func (c *Client) Stir(ctx context.Context) (float64, error) {
	cs, err := c.Counters(ctx)
	if err != nil {
		return 0, err
	}
	stir, live := cs.Stir()
	if !live {
		return 0, fmt.Errorf("%s: %w", c.kind.name, ErrCountersAtFinish)
	}
	return stir, nil
}
