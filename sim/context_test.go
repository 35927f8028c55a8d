package sim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// errorBody reads an error answer in any flavour's shape.
type errorBody struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
	Error   *struct {
		Message       string `json:"message"`
		Type          string `json:"type"`
		Code          int    `json:"code"`
		NPromptTokens int64  `json:"n_prompt_tokens"`
		NCtx          int64  `json:"n_ctx"`
	} `json:"error"`
}

func decodeError(t *testing.T, raw string) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		t.Fatalf("error body %q: %v", raw, err)
	}
	return e
}

func TestContextLimits(t *testing.T) {
	t.Parallel()
	t.Run("vllm", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorVLLM)
		c.MaxModelLen = 1000
		s := startSim(t, c)
		code, _, raw := chat(t, s.URL(), longChat(1000, "", 1))
		e := decodeError(t, raw)
		want := "This model's maximum context length is 1000 tokens. However, your request has 1000 input tokens. " +
			"Please reduce the length of the input messages."
		if code != 400 || e.Error == nil || e.Error.Message != want || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
			t.Errorf("a prompt of max_model_len: %d %s", code, raw)
		}
		code, _, raw = chat(t, s.URL(), longChat(999, "", 2))
		if e := decodeError(t, raw); code != 400 || e.Error == nil || !strings.HasPrefix(e.Error.Message, "'max_tokens' or 'max_completion_tokens' is too large: 2.") ||
			!strings.HasSuffix(e.Error.Message, "(2 > 1000 - 999).") {
			t.Errorf("prompt + max_tokens past max_model_len: %d %s", code, raw)
		}
		// Without max_tokens vLLM asks for what is left: one token.
		body := longChat(999, "", 1)
		delete(body, "max_tokens")
		code, resp, raw := chat(t, s.URL(), body)
		if code != 200 || resp.Usage.PromptTokens != 999 || resp.Usage.CompletionTokens != 1 || resp.Choices[0].FinishReason != "length" {
			t.Errorf("a prompt one short of max_model_len: %d %s", code, raw)
		}
		if r, w := s.InFlight(); r != 0 || w != 0 {
			t.Errorf("rejected requests left %d running, %d waiting", r, w)
		}
	})
	t.Run("vllm refuses to start when max_model_len exceeds a pool", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorVLLM)
		c.DP, c.KVTokens, c.MaxModelLen = 2, []int64{100000, 30000}, 40000
		_, err := Start(c, "127.0.0.1:0")
		if err == nil || !strings.Contains(err.Error(), "To serve at least one request with the models's max seq len (40000)") ||
			!strings.Contains(err.Error(), "the estimated maximum model length is 30000") {
			t.Errorf("start: %v", err)
		}
	})
	t.Run("vllm logs its max model len", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorVLLM)
		c.MaxModelLen, c.MaxBatchedTokens = 32768, 8192
		c.LogPath = filepath.Join(t.TempDir(), "vllm.log")
		startSim(t, c)
		log, err := os.ReadFile(c.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Using max model len 32768", "Chunked prefill is enabled with max_num_batched_tokens=8192.",
			"'max_model_len': 32768", "'max_num_batched_tokens': 8192", "Maximum concurrency for 32,768 tokens per request: 3.05x"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("log lacks %q", want)
			}
		}
	})
	t.Run("sglang", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorSGLang)
		c.MaxModelLen = 1000
		s := startSim(t, c)
		code, _, raw := chat(t, s.URL(), longChat(1000, "", 1))
		e := decodeError(t, raw)
		if code != 400 || e.Object != "error" || e.Code != 400 ||
			e.Message != "The input (1000 tokens) is longer than the model's context length (1000 tokens)." {
			t.Errorf("a prompt of context_length: %d %s", code, raw)
		}
		code, _, raw = chat(t, s.URL(), longChat(990, "", 10))
		if e := decodeError(t, raw); code != 400 || !strings.HasPrefix(e.Message,
			"Requested token count exceeds the model's maximum context length of 1000 tokens. You requested a total of 1000 tokens: "+
				"990 tokens from the input messages and 10 tokens for the completion.") {
			t.Errorf("prompt + max_tokens reaching context_length: %d %s", code, raw)
		}
	})
	t.Run("sglang rejects a prompt its rank's pool cannot hold", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorSGLang)
		c.DP, c.KVTokens, c.MaxRunning = 2, []int64{100000, 500}, 64
		s := startSim(t, c)
		if code, _, raw := chat(t, s.URL(), longChat(499, "a", 1)); code != 200 {
			t.Errorf("rank 0 takes a 499-token prompt: %d %s", code, raw)
		}
		code, _, raw := chat(t, s.URL(), longChat(499, "b", 1))
		if e := decodeError(t, raw); code != 400 || e.Message != "Input length (499 tokens) exceeds the maximum allowed length (499 tokens). "+
			"Use a shorter input or enable --allow-auto-truncate." {
			t.Errorf("rank 1 (pool 500) and a 499-token prompt: %d %s", code, raw)
		}
		// One that fits the pool but not with its max tokens runs to the pool's end.
		s.rr.Store(1)
		body := longChat(400, "c", 200)
		body["ignore_eos"] = true
		if code, resp, raw := chat(t, s.URL(), body); code != 200 || resp.Usage.CompletionTokens != 100 || resp.Choices[0].FinishReason != "length" {
			t.Errorf("a 400-token prompt with 200 max tokens on a pool of 500: %d %s", code, raw)
		}
	})
	t.Run("llamacpp", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorLlamaCpp)
		c.KVTokens = []int64{16 * 1000} // n_ctx 1000 per slot
		s := startSim(t, c)
		code, _, raw := chat(t, s.URL(), longChat(1000, "", 1))
		e := decodeError(t, raw)
		if code != 400 || e.Error == nil || e.Error.Type != "exceed_context_size_error" || e.Error.NPromptTokens != 1000 || e.Error.NCtx != 1000 ||
			e.Error.Message != "request (1000 tokens) exceeds the available context size (1000 tokens), try increasing it" {
			t.Errorf("a prompt of a slot's n_ctx: %d %s", code, raw)
		}
		body := longChat(990, "", 50)
		body["ignore_eos"] = true
		if code, resp, raw := chat(t, s.URL(), body); code != 200 || resp.Usage.CompletionTokens != 10 || resp.Choices[0].FinishReason != "length" {
			t.Errorf("generation past the slot's end: %d %s", code, raw)
		}
	})
	t.Run("ollama truncates", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorOllama)
		c.KVTokens = []int64{1000}
		s := startSim(t, c)
		if code, resp, raw := chat(t, s.URL(), longChat(1500, "", 1)); code != 200 || resp.Usage.PromptTokens != 999 {
			t.Errorf("a prompt past the context: %d %s, want it cut to 999 tokens", code, raw)
		}
	})
	t.Run("mlx", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorMLX)
		c.KVTokens = []int64{1000}
		s := startSim(t, c)
		if code, _, raw := chat(t, s.URL(), longChat(1000, "", 1)); code != 400 {
			t.Errorf("a prompt of the whole pool: %d %s", code, raw)
		}
	})
	t.Run("max-model-len only where the engine has it", func(t *testing.T) {
		t.Parallel()
		c := fast(FlavorLlamaCpp)
		c.MaxModelLen = 4096
		if _, err := Start(c, "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "takes its context from the pool") {
			t.Errorf("start: %v", err)
		}
	})
}
