package probe

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// specEngine is a fake vLLM with speculative decoding: after a request's
// first token, each chunk carries three, and its usage says the tokens so
// far when asked for continuous usage. Its generated counter counts every
// token it sends. Its running gauge may be refreshed late (SGLang sets
// its gauges every 40 decode steps): a request stays in it for lag after
// it ended. Requests take 2, 4, 6 and 8 ms a chunk in turn, so they end
// a quarter of a second apart.
type specEngine struct {
	*fakeEngine
	generated atomic.Int64
	// refuse answers a request asking for continuous usage with 400, as
	// vLLM before 0.5.1 does.
	refuse bool
	lag    time.Duration

	mu    sync.Mutex
	ended []time.Time // zero while running
}

func newSpecEngine(t *testing.T, refuse bool, lag time.Duration) *specEngine {
	e := &specEngine{refuse: refuse, lag: lag}
	e.fakeEngine = newFake(t, func(f *fakeEngine) { f.stream = e.stream })
	return e
}

func (e *specEngine) stream(n int64, w http.ResponseWriter, r *http.Request, req map[string]any) {
	opts, _ := req["stream_options"].(map[string]any)
	continuous := opts["continuous_usage_stats"] == true
	if continuous && e.refuse {
		http.Error(w, `{"object":"error","message":"[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options', 'continuous_usage_stats'), 'msg': 'Extra inputs are not permitted'}]","code":400}`, http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	i := len(e.ended)
	e.ended = append(e.ended, time.Time{})
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.ended[i] = time.Now()
		e.mu.Unlock()
	}()

	tokens, pause := intField(req, "max_tokens"), time.Duration((n-1)%4+1)*2*time.Millisecond
	startStream(w)
	for sent := 0; sent < tokens; {
		step := min(tokens-sent, 3)
		if sent == 0 {
			step = 1
		}
		sent += step
		e.generated.Add(int64(step))
		usage := ""
		if continuous {
			usage = fmt.Sprintf(`,"usage":{"prompt_tokens":12,"completion_tokens":%d}`, sent)
		}
		writeEvent(w, fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":%q}}]%s}`, strings.Repeat("x", step), usage))
		time.Sleep(pause)
	}
	writeEvent(w, fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d}}`, tokens))
	writeEvent(w, "[DONE]")
}

func (e *specEngine) counter(context.Context) (engine.Counters, error) {
	return engine.Counters{Generated: float64(e.generated.Load())}, nil
}

func (e *specEngine) load(context.Context) (wire.Load, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := wire.Load{Known: true}
	for _, end := range e.ended {
		if end.IsZero() || time.Since(end) < e.lag {
			l.Running++
		}
	}
	return l, nil
}

// With speculative decoding an engine makes three tokens for each chunk
// it streams, so a burst counted by chunks always looks behind the
// engine's counter, and its load gauge alone decided whether other
// traffic had come: one refreshed late, still showing the burst's ended
// requests, stopped a clean burst. Counted by the usage in each chunk,
// the burst keeps up with the counter and is measured. An engine that
// refuses continuous usage (its gauge timely here) is asked again without
// it.
func TestSpeculativeBurstCountedByUsage(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuses continuous usage: %v", refuse), func(t *testing.T) {
			t.Parallel()
			lag := 300 * time.Millisecond
			if refuse {
				lag = 0
			}
			e := newSpecEngine(t, refuse, lag)
			cfg := quick(e.URL())
			cfg.Tokens, cfg.Counters, cfg.Load, cfg.watchPoll = 384, e.counter, e.load, 20*time.Millisecond
			m := mustRun(t, cfg)
			if !m.Valid() || m.OutputTokens != 4*384 || m.EngineGeneratedTokens != 4*384 {
				t.Fatalf("valid %v, %d tokens, engine counted %d; problems %q", m.Valid(), m.OutputTokens, m.EngineGeneratedTokens, m.Problems)
			}
			refused := hasProblem(m, "refused stream_options.continuous_usage_stats")
			if chats := e.chats.Load(); refused != refuse || (refuse && chats != 12) || (!refuse && chats != 8) {
				t.Errorf("%d requests, refusal noted %v; problems %q", chats, refused, m.Problems)
			}
		})
	}
}
