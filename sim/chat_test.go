package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestLength(t *testing.T) {
	t.Parallel()
	// max 2000 is above every natural length (< NaturalMax), so a response
	// that may end early always ends with "stop" below it.
	for _, tc := range []struct {
		name   string
		flavor string
		body   map[string]any
		exact  int // 0: must end early
	}{
		{"vllm min_tokens", FlavorVLLM, map[string]any{"max_tokens": 64, "min_tokens": 64}, 64},
		{"vllm min_tokens above max", FlavorVLLM, map[string]any{"max_tokens": 64, "min_tokens": 100}, 64},
		{"vllm ignore_eos", FlavorVLLM, map[string]any{"max_tokens": 64, "ignore_eos": true}, 64},
		{"vllm max_completion_tokens wins", FlavorVLLM, map[string]any{"max_completion_tokens": 40, "max_tokens": 64, "min_tokens": 40}, 40},
		{"vllm neither", FlavorVLLM, map[string]any{"max_tokens": 2000}, 0},
		{"vllm small min_tokens", FlavorVLLM, map[string]any{"max_tokens": 2000, "min_tokens": 10}, 0},
		{"sglang min_tokens", FlavorSGLang, map[string]any{"max_completion_tokens": 33, "min_tokens": 33}, 33},
		{"sglang ignore_eos", FlavorSGLang, map[string]any{"max_tokens": 33, "ignore_eos": true}, 33},
		{"llamacpp n_predict ignore_eos", FlavorLlamaCpp, map[string]any{"n_predict": 50, "max_tokens": 9, "ignore_eos": true}, 50},
		{"llamacpp max_tokens ignore_eos", FlavorLlamaCpp, map[string]any{"max_tokens": 50, "ignore_eos": true}, 50},
		{"llamacpp has no min_tokens", FlavorLlamaCpp, map[string]any{"max_tokens": 2000, "min_tokens": 2000}, 0},
		{"mlx ignores ignore_eos", FlavorMLX, map[string]any{"max_tokens": 2000, "ignore_eos": true, "min_tokens": 2000}, 0},
		{"mlx max_completion_tokens", FlavorMLX, map[string]any{"max_completion_tokens": 5, "max_tokens": 2000}, 5},
		{"ollama ignores ignore_eos", FlavorOllama, map[string]any{"max_tokens": 2000, "ignore_eos": true, "min_tokens": 2000}, 0},
		{"ollama has no max_completion_tokens", FlavorOllama, map[string]any{"max_completion_tokens": 5, "max_tokens": 2000}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startSim(t, fast(tc.flavor))
			body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hello"}}}
			for k, v := range tc.body {
				body[k] = v
			}
			r := streamChat(t, s.URL(), body)
			if r.status != 200 || !r.done || r.garbled != 0 {
				t.Fatalf("stream: %+v", r)
			}
			if tc.exact > 0 {
				if r.tokens != tc.exact || r.finish != "length" {
					t.Errorf("got %d tokens, finish %q; want exactly %d, length", r.tokens, r.finish, tc.exact)
				}
				return
			}
			if r.tokens < NaturalMin || r.tokens >= NaturalMax || r.finish != "stop" {
				t.Errorf("got %d tokens, finish %q; want an early stop in [%d, %d)", r.tokens, r.finish, NaturalMin, NaturalMax)
			}
			if m, ok := tc.body["min_tokens"].(int); ok && tc.flavor == FlavorVLLM && r.tokens < m {
				t.Errorf("got %d tokens, below min_tokens %d", r.tokens, m)
			}
		})
	}
}

func TestNaturalLengthsAreSeeded(t *testing.T) {
	t.Parallel()
	lengths := func(seed int64) []int {
		cfg := fast(FlavorVLLM)
		cfg.Seed = seed
		s := startSim(t, cfg)
		var out []int
		for range 5 {
			_, resp, raw := chat(t, s.URL(), chatBody(300, nil))
			if len(resp.Choices) != 1 {
				t.Fatalf("response: %s", raw)
			}
			out = append(out, resp.Usage.CompletionTokens)
		}
		return out
	}
	a, b, c := lengths(7), lengths(7), lengths(8)
	if !equalInts(a, b) {
		t.Errorf("same seed, different lengths: %v vs %v", a, b)
	}
	if equalInts(a, c) {
		t.Errorf("different seeds, same lengths: %v", a)
	}
	for _, n := range a {
		if n < NaturalMin || n > 300 {
			t.Errorf("length %d outside [%d, 300]", n, NaturalMin)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestUsage(t *testing.T) {
	t.Parallel()
	cfg := fast(FlavorVLLM)
	cfg.PromptTokens = 37
	s := startSim(t, cfg)

	t.Run("streamed with include_usage", func(t *testing.T) {
		r := streamChat(t, s.URL(), chatBody(12, map[string]any{"min_tokens": 12, "stream_options": map[string]any{"include_usage": true}}))
		if r.usage == nil {
			t.Fatalf("no usage chunk: %+v", r)
		}
		want := usage{PromptTokens: 37, CompletionTokens: 12, TotalTokens: 49}
		if *r.usage != want || r.tokens != 12 {
			t.Errorf("usage %+v with %d streamed tokens, want %+v", *r.usage, r.tokens, want)
		}
	})
	t.Run("streamed without include_usage", func(t *testing.T) {
		r := streamChat(t, s.URL(), chatBody(12, map[string]any{"min_tokens": 12}))
		if r.usage != nil || !r.done {
			t.Errorf("unexpected usage or no [DONE]: %+v", r)
		}
	})
	t.Run("not streamed", func(t *testing.T) {
		code, resp, raw := chat(t, s.URL(), chatBody(12, map[string]any{"min_tokens": 12}))
		if code != 200 || len(resp.Choices) != 1 {
			t.Fatalf("chat: %d %s", code, raw)
		}
		if want := (usage{PromptTokens: 37, CompletionTokens: 12, TotalTokens: 49}); resp.Usage != want {
			t.Errorf("usage %+v, want %+v", resp.Usage, want)
		}
		if words := len(strings.Fields(resp.Choices[0].Message.Content)); words != 12 {
			t.Errorf("content has %d words, want 12: %q", words, resp.Choices[0].Message.Content)
		}
		if resp.Choices[0].FinishReason != "length" {
			t.Errorf("finish_reason %q", resp.Choices[0].FinishReason)
		}
	})
}

func TestPromptTokenEstimate(t *testing.T) {
	t.Parallel()
	s := startSim(t, fast(FlavorVLLM))
	body := map[string]any{
		"max_tokens": 1,
		"messages": []any{
			map[string]any{"role": "system", "content": "one two three four five six seven eight nine ten"},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "a b c"}}},
		},
	}
	_, resp, raw := chat(t, s.URL(), body)
	// 2 + (4 + 10 words) + (4 + 3 words) = 23
	if resp.Usage.PromptTokens != 23 {
		t.Errorf("prompt tokens %d, want 23: %s", resp.Usage.PromptTokens, raw)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	cfg := fast(FlavorVLLM)
	cfg.KVTokens = []int64{1000}
	cfg.PromptTokens = 100
	s := startSim(t, cfg)
	for _, tc := range []struct {
		name string
		body any
		code int
		want string
	}{
		{"past max_model_len", chatBody(950, nil), 400,
			"'max_tokens' or 'max_completion_tokens' is too large: 950. This model's maximum context length is 1000 tokens " +
				"and your request has 100 input tokens (950 > 1000 - 100)."},
		{"zero max", chatBody(0, nil), 400, "max_tokens must be at least 1"},
		{"negative min", chatBody(5, map[string]any{"min_tokens": -1}), 400, "min_tokens"},
		{"no messages", map[string]any{"max_tokens": 5}, 400, "messages"},
		{"wrong type", map[string]any{"messages": "hi"}, 400, "not a valid chat completion request"},
		{"unknown model", chatBody(5, map[string]any{"model": "other/model"}), 404, "does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := post(t.Context(), s.URL(), tc.body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct {
					Message string `json:"message"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("decode error body: %v", err)
			}
			e := body.Error
			if resp.StatusCode != tc.code || e.Code != tc.code || !strings.Contains(e.Message, tc.want) {
				t.Errorf("got %d %+v, want %d with %q", resp.StatusCode, e, tc.code, tc.want)
			}
		})
	}
	if r, w := s.InFlight(); r != 0 || w != 0 {
		t.Errorf("rejected requests left %d running, %d waiting", r, w)
	}
}

func TestClientDisconnectFreesSequence(t *testing.T) {
	t.Parallel()
	s := startSim(t, Config{SingleTPS: 200, Batch16TPS: 1600})
	ctx, cancel := context.WithCancel(t.Context())
	body := chatBody(5000, map[string]any{"ignore_eos": true, "stream": true})
	resp, err := post(ctx, s.URL(), body)
	if err != nil {
		t.Fatal(err)
	}
	r := readStream(resp, func(n int) {
		if n == 3 {
			cancel()
		}
	})
	if r.done || r.tokens < 3 {
		t.Fatalf("stream: %+v", r)
	}
	waitFor(t, "sequence freed", func() bool { run, wait := s.InFlight(); return run == 0 && wait == 0 })
	mfs := scrape(t, s.URL())
	if got := value(t, mfs, "vllm:request_success_total", map[string]string{"finished_reason": "abort"}); got != 1 {
		t.Errorf("abort count %v, want 1", got)
	}
	if got := value(t, mfs, "vllm:kv_cache_usage_perc", nil); got != 0 {
		t.Errorf("kv usage %v after the only request left", got)
	}
}

func TestMLXChatAlias(t *testing.T) {
	t.Parallel()
	s := startSim(t, fast(FlavorMLX))
	resp, err := http.Post(s.URL()+"/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"max_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("mlx /chat/completions: %d", resp.StatusCode)
	}
}

func TestPromptUsageEveryFlavor(t *testing.T) {
	t.Parallel()
	for _, flavor := range Flavors {
		t.Run(flavor, func(t *testing.T) {
			t.Parallel()
			c := fast(flavor)
			c.PrefillTPS = 1e6
			s := startSim(t, c)
			body := longChat(300, flavor, 2)
			if _, resp, raw := chat(t, s.URL(), body); resp.Usage.PromptTokens != 300 || resp.Usage.TotalTokens != 300+int64(resp.Usage.CompletionTokens) {
				t.Errorf("not streamed: %s", raw)
			}
			body["stream_options"] = map[string]any{"include_usage": true}
			if r := streamChat(t, s.URL(), body); r.usage == nil || r.usage.PromptTokens != 300 {
				t.Errorf("streamed: %+v", r)
			}
		})
	}
}
