package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
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
			const notReady = time.Second
			s := startSim(t, withFaults(flavor, Faults{NotReadyFor: notReady}))
			code, body := getBody(t, s.URL()+"/health")
			if time.Since(s.start) >= notReady {
				t.Skip("machine too slow: the first health check came back after the not-ready window")
			}
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
		})
	}
}
