package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func withFaults(flavor string, f Faults) Config {
	c := fast(flavor)
	c.Faults = f
	return c
}

func TestFaultIgnoreMinTokens(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorVLLM, Faults{IgnoreMinTokens: true}))
	for _, extra := range []map[string]any{{"min_tokens": 2000}, {"ignore_eos": true}} {
		r := streamChat(t, s.URL(), chatBody(2000, extra))
		if r.tokens >= NaturalMax || r.finish != "stop" || !r.done {
			t.Errorf("%v: got %d tokens, finish %q; the lying engine should stop early", extra, r.tokens, r.finish)
		}
	}
}

func TestFaultUsageExtra(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorSGLang, Faults{UsageExtra: 5}))
	r := streamChat(t, s.URL(), chatBody(20, map[string]any{"min_tokens": 20, "stream_options": map[string]any{"include_usage": true}}))
	if r.tokens != 20 || r.usage == nil || r.usage.CompletionTokens != 25 {
		t.Errorf("streamed %d tokens, usage %+v; want 20 and 25", r.tokens, r.usage)
	}
	_, resp, _ := chat(t, s.URL(), chatBody(20, map[string]any{"min_tokens": 20}))
	if resp.Usage.CompletionTokens != 25 || resp.Usage.TotalTokens != resp.Usage.PromptTokens+25 {
		t.Errorf("non-streamed usage %+v, want 25 completion tokens", resp.Usage)
	}
}

func TestFaultFailEvery(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorVLLM, Faults{FailEvery: 3}))
	var codes []int
	for range 7 {
		code, _, _ := chat(t, s.URL(), chatBody(2, nil))
		codes = append(codes, code)
	}
	want := []int{200, 200, 500, 200, 200, 500, 200}
	if !equalInts(codes, want) {
		t.Errorf("status codes %v, want %v", codes, want)
	}
}

func TestFaultDropStream(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorVLLM, Faults{DropStreamAfter: 10}))
	r := streamChat(t, s.URL(), chatBody(50, map[string]any{"min_tokens": 50}))
	if r.tokens != 10 || r.done {
		t.Errorf("got %d tokens, done=%v; want the stream cut after 10 with no [DONE]", r.tokens, r.done)
	}
	if !errors.Is(r.readErr, io.ErrUnexpectedEOF) {
		t.Errorf("read error %v, want an unexpected EOF (connection closed mid-body)", r.readErr)
	}
	waitFor(t, "cut sequence freed", func() bool { run, wait := s.InFlight(); return run == 0 && wait == 0 })

	// A response shorter than the cut is whole.
	if r := streamChat(t, s.URL(), chatBody(8, map[string]any{"min_tokens": 8})); r.tokens != 8 || !r.done {
		t.Errorf("short response: %+v", r)
	}
}

func TestFaultMalformedSSE(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorVLLM, Faults{MalformedSSE: true}))
	r := streamChat(t, s.URL(), chatBody(30, map[string]any{"min_tokens": 30}))
	if r.garbled != 1 || r.tokens != 30 || !r.done {
		t.Errorf("got %d garbled lines, %d tokens, done=%v; want 1, 30, true", r.garbled, r.tokens, r.done)
	}
}

func TestFaultNotReady(t *testing.T) {
	t.Parallel()
	for _, flavor := range []string{FlavorVLLM, FlavorLlamaCpp} {
		t.Run(flavor, func(t *testing.T) {
			t.Parallel()
			// On the bubble's clock the first check comes at once, however
			// busy the machine (on the wall clock it could miss the window).
			synctest.Test(t, func(t *testing.T) { faultNotReady(t, flavor) })
		})
	}
}

// faultNotReady checks one flavor in a bubble: not ready at start (with
// llama.cpp's loading body), ready once the window has passed, not before.
func faultNotReady(t *testing.T, flavor string) {
	const notReady = time.Second
	s := bubbleSim(t, withFaults(flavor, Faults{NotReadyFor: notReady}))
	code, body := getBody(t, s.URL()+"/health")
	if code != http.StatusServiceUnavailable {
		t.Fatalf("health right after start: %d %s", code, body)
	}
	if flavor == FlavorLlamaCpp {
		var e struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != 503 || e.Error.Message != "Loading model" || e.Error.Type != "unavailable_error" {
			t.Errorf("llamacpp loading body %s (%v)", body, err)
		}
	}
	waitFor(t, "ready", func() bool { c, _ := getBody(t, s.URL()+"/health"); return c == http.StatusOK })
	if got := time.Since(s.start); got < notReady {
		t.Errorf("ready after %v, want not before %v", got, notReady)
	}
}

func TestFaultTruncatePrompt(t *testing.T) {
	t.Parallel()
	c := withFaults(FlavorVLLM, Faults{TruncatePrompt: 100})
	c.PrefillTPS = 100000
	s := startSim(t, c)
	code, resp, raw := chat(t, s.URL(), longChat(1000, "", 1))
	if code != 200 || resp.Usage.PromptTokens != 100 {
		t.Errorf("a 1000-token prompt: %d %s, want it reported as the 100 kept", code, raw)
	}
	// The engine read only what it kept.
	if got := value(t, scrape(t, s.URL()), "vllm:prompt_tokens_total", nil); got != 100 {
		t.Errorf("prompt tokens processed %v, want 100", got)
	}
	// Its tokenizer still counts the whole prompt.
	code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"messages": []any{map[string]any{"role": "user", "content": longPrompt(1000, "")}}})
	if code != 200 || !strings.Contains(string(b), `"count":1000`) {
		t.Errorf("tokenize: %d %s", code, b)
	}
	if _, resp, raw := chat(t, s.URL(), longChat(50, "", 1)); resp.Usage.PromptTokens != 50 {
		t.Errorf("a prompt shorter than the cut: %s", raw)
	}
}

func TestFaultPromptUsageExtra(t *testing.T) {
	t.Parallel()
	s := startSim(t, withFaults(FlavorSGLang, Faults{PromptUsageExtra: 7}))
	r := streamChat(t, s.URL(), map[string]any{"messages": longChat(300, "", 2)["messages"], "max_tokens": 2, "min_tokens": 2,
		"stream_options": map[string]any{"include_usage": true}})
	if r.usage == nil || r.usage.PromptTokens != 307 || r.usage.TotalTokens != 309 {
		t.Errorf("streamed usage %+v, want prompt_tokens 307", r.usage)
	}
	_, resp, raw := chat(t, s.URL(), longChat(300, "", 2))
	if resp.Usage.PromptTokens != 307 {
		t.Errorf("usage: %s, want prompt_tokens 307", raw)
	}
	if got := value(t, scrape(t, s.URL()), "sglang:prompt_tokens_total", nil); got != 600 {
		t.Errorf("the engine's own counter %v, want the true 600", got)
	}
}

func TestFaultPrefillCached(t *testing.T) {
	t.Parallel()
	// At P = 100 tok/s a 3000-token prompt takes 30 s; served as cached it
	// is answered after one decode step, with no cache hit to show for it.
	c := withFaults(FlavorVLLM, Faults{PrefillCached: true})
	c.PrefillTPS, c.ReportCachedTokens = 100, true
	s := startSim(t, c)
	done := make(chan nonStream, 1)
	go func() {
		_, resp, _ := chat(t, s.URL(), longChat(3000, "", 1))
		done <- resp
	}()
	select {
	case resp := <-done:
		if resp.Usage.PromptTokens != 3000 || cachedOf(resp.Usage) != 0 {
			t.Errorf("usage %+v, want 3000 prompt tokens and no reported cache hit", resp.Usage)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a prompt served as cached took longer than 10 s (its true prefill: 30 s)")
	}
}

func TestFaultRejectLong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ flavor, want string }{
		{FlavorVLLM, "This model's maximum context length is 500 tokens. However, your request has 501 input tokens."},
		{FlavorSGLang, "The input (501 tokens) is longer than the model's context length (500 tokens)."},
		{FlavorLlamaCpp, "request (501 tokens) exceeds the available context size (500 tokens), try increasing it"},
		{FlavorOllama, "the input length (501 tokens) exceeds the context length (500 tokens)"},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			t.Parallel()
			s := startSim(t, withFaults(tc.flavor, Faults{RejectLong: 500}))
			code, _, raw := chat(t, s.URL(), longChat(501, "", 1))
			if code != 400 || !strings.Contains(raw, tc.want) {
				t.Errorf("501 tokens: %d %s", code, raw)
			}
			if code, _, raw := chat(t, s.URL(), longChat(500, "", 1)); code != 200 {
				t.Errorf("500 tokens: %d %s", code, raw)
			}
		})
	}
}

// A start-up log that is not the engine's current run: the log prints
// the fault's pools, /metrics and /v1/loads keep the ranks' real ones.
func TestFaultLogKVTokens(t *testing.T) {
	t.Parallel()
	cfg := withFaults(FlavorSGLang, Faults{LogKVTokens: []int64{24094}})
	cfg.DP, cfg.KVTokens = 2, []int64{24094, 2925}
	s, lines := startWithLog(t, cfg)
	var logged []string
	for _, l := range lines {
		if i := strings.Index(l, "max_total_num_tokens="); i >= 0 {
			logged = append(logged, strings.SplitN(l[i:], ",", 2)[0])
		}
	}
	if strings.Join(logged, " ") != "max_total_num_tokens=24094 max_total_num_tokens=24094" {
		t.Errorf("the log says %v, want the fault's 24094 for both ranks", logged)
	}
	_, body := getBody(t, s.URL()+"/metrics")
	if !strings.Contains(string(body), `dp_rank="1",`) || !strings.Contains(string(body), "2925") {
		t.Errorf("metrics lost rank 1's real pool:\n%s", body)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "sglang:max_total_num_tokens{") && strings.Contains(l, `dp_rank="1"`) && !strings.HasSuffix(l, " 2925.0") {
			t.Errorf("rank 1's pool in /metrics: %s", l)
		}
	}
}
