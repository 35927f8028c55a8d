package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// cachedOf is usage.prompt_tokens_details.cached_tokens, -1 when absent.
func cachedOf(u usage) int64 {
	if u.PromptTokensDetails == nil {
		return -1
	}
	return u.PromptTokensDetails.CachedTokens
}

func TestPrefixCache(t *testing.T) {
	t.Parallel()
	const prompt = 1000
	for _, tc := range []struct {
		name        string
		cfg         Config
		repeatHit   int64 // cached_tokens of a repeated prompt
		uniqueHit   int64 // of a prompt with a new first word
		wantHitsSum float64
	}{
		// vLLM: whole blocks of 16 within the first 999 tokens; a new first
		// word spoils the first block.
		{"vllm", Config{SingleTPS: 20000, Batch16TPS: 160000, PrefillTPS: 20000, ReportCachedTokens: true}, 992, 0, 992},
		// SGLang: every token but the last; a new first word leaves the 3
		// template tokens before it (<|im_start|>, user, newline).
		{"sglang", Config{Flavor: FlavorSGLang, SingleTPS: 20000, Batch16TPS: 160000, PrefillTPS: 20000, ReportCachedTokens: true}, 999, 3, 1002},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startSim(t, tc.cfg)
			_, first, raw := chat(t, s.URL(), longChat(prompt, "same", 1))
			if cachedOf(first.Usage) != 0 {
				t.Fatalf("first prompt: %s", raw)
			}
			_, again, raw := chat(t, s.URL(), longChat(prompt, "same", 1))
			if cachedOf(again.Usage) != tc.repeatHit || again.Usage.PromptTokens != prompt {
				t.Errorf("repeated prompt: %s, want %d cached", raw, tc.repeatHit)
			}
			_, unique, raw := chat(t, s.URL(), longChat(prompt, "other", 1))
			if cachedOf(unique.Usage) != tc.uniqueHit {
				t.Errorf("prompt with a new first word: %s, want %d cached", raw, tc.uniqueHit)
			}
			mfs := scrape(t, s.URL())
			switch tc.cfg.Flavor {
			case FlavorSGLang:
				if got := value(t, mfs, "sglang:cached_tokens_total", nil); got != tc.wantHitsSum {
					t.Errorf("sglang:cached_tokens_total %v, want %v", got, tc.wantHitsSum)
				}
				if got := value(t, mfs, "sglang:prompt_tokens_total", nil); got != 3*prompt {
					t.Errorf("sglang:prompt_tokens_total %v, want %d", got, 3*prompt)
				}
				if got := value(t, mfs, "sglang:cache_hit_rate", nil); !near(got, tc.wantHitsSum/(3*prompt), 1e-9) {
					t.Errorf("sglang:cache_hit_rate %v", got)
				}
			default:
				if got := value(t, mfs, "vllm:prefix_cache_hits_total", nil); got != tc.wantHitsSum {
					t.Errorf("vllm:prefix_cache_hits_total %v, want %v", got, tc.wantHitsSum)
				}
				if got := value(t, mfs, "vllm:prefix_cache_queries_total", nil); got != 3*prompt {
					t.Errorf("vllm:prefix_cache_queries_total %v, want %d", got, 3*prompt)
				}
				if got := value(t, mfs, "vllm:prompt_tokens_total", nil); got != 3*prompt {
					t.Errorf("vllm:prompt_tokens_total %v, want %d (cached tokens count too)", got, 3*prompt)
				}
			}
		})
	}
	t.Run("a cache hit is served fast", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// 2000 tokens at P = 5000 take 0.4 s and the one output token
			// 1 ms (S1 = 1000); the repeat computes 1 token (0.2 ms). In the
			// bubble these are the times, to the sim's 1 ns wake.
			s := bubbleSim(t, Config{Flavor: FlavorSGLang, SingleTPS: 1000, Batch16TPS: 8000, PrefillTPS: 5000})
			_, cold := timedChat(t, s.URL(), longChat(2000, "fast", 1))
			_, hit := timedChat(t, s.URL(), longChat(2000, "fast", 1))
			near := func(got, want time.Duration) bool { return (got - want).Abs() <= time.Microsecond }
			if !near(cold, 401*time.Millisecond) || !near(hit, 1200*time.Microsecond) {
				t.Errorf("first prompt took %v, the repeat %v: want 401ms and 1.2ms", cold, hit)
			}
		})
	})
	t.Run("off", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, Config{SingleTPS: 20000, Batch16TPS: 160000, NoPrefixCache: true, ReportCachedTokens: true})
		chat(t, s.URL(), longChat(prompt, "same", 1))
		if _, again, raw := chat(t, s.URL(), longChat(prompt, "same", 1)); cachedOf(again.Usage) != 0 {
			t.Errorf("repeat with the cache off: %s", raw)
		}
		mfs := scrape(t, s.URL())
		if got := value(t, mfs, "vllm:prefix_cache_queries_total", nil); got != 0 {
			t.Errorf("queries %v with the cache off", got)
		}
		if l := labelsOf(mfs["vllm:cache_config_info"].GetMetric()[0]); l["enable_prefix_caching"] != "False" {
			t.Errorf("cache_config_info %v", l)
		}
	})
	t.Run("not reported unless asked", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorVLLM))
		r := streamChat(t, s.URL(), chatBody(3, map[string]any{"min_tokens": 3, "stream_options": map[string]any{"include_usage": true}}))
		if r.usage == nil || r.usage.PromptTokensDetails != nil {
			t.Errorf("usage %+v, want no prompt_tokens_details", r.usage)
		}
	})
	t.Run("llamacpp timings and counters", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, Config{Flavor: FlavorLlamaCpp, SingleTPS: 20000, Batch16TPS: 160000, PrefillTPS: 100000})
		chat(t, s.URL(), longChat(prompt, "same", 1))
		_, body, raw := chatRaw(t, s.URL(), longChat(prompt, "same", 1))
		var out struct {
			Timings llamaTimings `json:"timings"`
			Usage   usage        `json:"usage"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		if out.Timings.CacheN != 999 || out.Timings.PromptN != 1 || out.Timings.PredictedN != 1 || out.Usage.PromptTokens != prompt {
			t.Errorf("repeat: %s", raw)
		}
		// llama.cpp counts the prompt tokens it computed.
		if got := value(t, scrape(t, s.URL()), "llamacpp:prompt_tokens_total", nil); got != prompt+1 {
			t.Errorf("llamacpp:prompt_tokens_total %v, want %d", got, prompt+1)
		}
	})
}

// chatRaw posts body and returns the status and raw answer.
func chatRaw(t *testing.T, url string, body any) (int, []byte, string) {
	t.Helper()
	resp, err := post(t.Context(), url, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.Bytes(), b.String()
}

func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

func TestTokenizeCountsAsChatDoes(t *testing.T) {
	t.Parallel()
	messages := []any{map[string]any{"role": "user", "content": longPrompt(777, "tok")}}
	t.Run("vllm", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorVLLM))
		_, resp, _ := chat(t, s.URL(), map[string]any{"messages": messages, "max_tokens": 1})
		code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"model": DefaultModel, "messages": messages})
		var tok struct {
			Count       int      `json:"count"`
			MaxModelLen int64    `json:"max_model_len"`
			Tokens      []uint32 `json:"tokens"`
		}
		if err := json.Unmarshal(b, &tok); err != nil || code != 200 {
			t.Fatalf("tokenize: %d %s", code, b)
		}
		if int64(tok.Count) != resp.Usage.PromptTokens || tok.Count != 777 || len(tok.Tokens) != 777 || tok.MaxModelLen != 40960 {
			t.Errorf("tokenize count %d (%d ids, max_model_len %d), chat usage %d, want 777", tok.Count, len(tok.Tokens), tok.MaxModelLen, resp.Usage.PromptTokens)
		}
		code, b = postJSON(t, s.URL()+"/tokenize", map[string]any{"prompt": "one two three averylongwordxyz"})
		if err := json.Unmarshal(b, &tok); err != nil || code != 200 || tok.Count != 5 {
			t.Errorf("tokenize a prompt: %d %s, want 5 (a 16-byte word is 2 tokens)", code, b)
		}
		if code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"model": "other", "prompt": "x"}); code != 404 {
			t.Errorf("another model: %d %s", code, b)
		}
	})
	t.Run("sglang", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorSGLang))
		for _, path := range []string{"/tokenize", "/v1/tokenize"} {
			code, b := postJSON(t, s.URL()+path, map[string]any{"prompt": longPrompt(777, "tok")})
			var tok struct {
				Count       int   `json:"count"`
				MaxModelLen int64 `json:"max_model_len"`
			}
			// SGLang tokenizes text without the chat template: 777 − 6.
			if err := json.Unmarshal(b, &tok); err != nil || code != 200 || tok.Count != 771 || tok.MaxModelLen != 40960 {
				t.Errorf("%s: %d %s", path, code, b)
			}
		}
		code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"prompt": []string{"a b", "c"}})
		var many struct{ Count []int }
		if err := json.Unmarshal(b, &many); err != nil || code != 200 || len(many.Count) != 2 || many.Count[0] != 2 || many.Count[1] != 1 {
			t.Errorf("a list: %d %s", code, b)
		}
	})
	t.Run("llamacpp", func(t *testing.T) {
		t.Parallel()
		s := startSim(t, fast(FlavorLlamaCpp))
		code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"content": "a b c"})
		var tok struct{ Tokens []uint32 }
		if err := json.Unmarshal(b, &tok); err != nil || code != 200 || len(tok.Tokens) != 3 {
			t.Errorf("tokenize: %d %s", code, b)
		}
	})
	for _, flavor := range []string{FlavorOllama, FlavorMLX} {
		t.Run(flavor+" has none", func(t *testing.T) {
			t.Parallel()
			s := startSim(t, fast(flavor))
			if code, b := postJSON(t, s.URL()+"/tokenize", map[string]any{"content": "a"}); code != 404 {
				t.Errorf("tokenize: %d %s", code, b)
			}
		})
	}
}

func TestPromptCountersCountAtTheirMoment(t *testing.T) {
	t.Parallel()
	// SGLang counts a prompt when its request finishes, vLLM when its first
	// token comes: a long decode after a 500-token prompt shows the difference.
	for _, flavor := range []string{FlavorVLLM, FlavorSGLang} {
		t.Run(flavor, func(t *testing.T) {
			t.Parallel()
			s := startSim(t, Config{Flavor: flavor, SingleTPS: 200, Batch16TPS: 1600, PrefillTPS: 50000})
			body := longChat(500, "count", 2000)
			body["ignore_eos"], body["stream"] = true, true
			resp, err := post(t.Context(), s.URL(), body)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan struct{})
			go readStream(resp, func(n int) {
				if n == 1 {
					close(got)
				}
			})
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("no first token")
			}
			mfs := scrape(t, s.URL())
			name, want := "vllm:prompt_tokens_total", 500.0
			if flavor == FlavorSGLang {
				name, want = "sglang:prompt_tokens_total", 0
			}
			if v := value(t, mfs, name, nil); v != want {
				t.Errorf("%s = %v after the first token, want %v", name, v, want)
			}
			resp.Body.Close()
		})
	}
}
