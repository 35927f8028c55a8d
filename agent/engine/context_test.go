package engine

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"heft/shared/wire"
	"heft/sim"
)

func startSimEngine(t *testing.T, cfg sim.Config) *sim.Server {
	t.Helper()
	if cfg.SingleTPS == 0 {
		cfg.SingleTPS, cfg.Batch16TPS = 100, 1200
	}
	s, err := sim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start sim: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Each kind says its maximum model length in its own place, and what a
// worker can really hold is the smaller of that and its smallest pool.
func TestMaxModelLenFromEachKind(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     sim.Config
		maxLen  int64
		source  string
		context int64
	}{
		{"vllm, capped by nothing", sim.Config{Flavor: sim.FlavorVLLM}, 40960, SourceModels, 40960},
		{"vllm, max-model-len set", sim.Config{Flavor: sim.FlavorVLLM, MaxModelLen: 16384}, 16384, SourceModels, 16384},
		// SGLang starts with a context its small rank cannot hold.
		{"sglang, uneven pools", sim.Config{Flavor: sim.FlavorSGLang, DP: 2, KVTokens: []int64{24094, 2925}}, 40960, SourceModels, 2925},
		{"llama.cpp, a slot's n_ctx", sim.Config{Flavor: sim.FlavorLlamaCpp, KVTokens: []int64{16 * 9216}}, 9216, SourceProps, 9216},
		{"ollama, /api/ps", sim.Config{Flavor: sim.FlavorOllama, KVTokens: []int64{8192}}, 8192, SourceAPIPS, 8192},
		{"mlx says nothing", sim.Config{Flavor: sim.FlavorMLX}, 0, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startSimEngine(t, tc.cfg)
			e := newClient(t, tc.cfg.Flavor, s.URL(), nil).Facts(t.Context(), nil, nil)
			checkWire(t, e)
			if e.MaxModelLen != tc.maxLen || e.MaxModelLenSource != tc.source {
				t.Errorf("max model len %d from %q, want %d from %q", e.MaxModelLen, e.MaxModelLenSource, tc.maxLen, tc.source)
			}
			if got := e.MaxContextTokens(); got != tc.context {
				t.Errorf("max context tokens %d, want %d (ranks %+v)", got, tc.context, e.Ranks)
			}
		})
	}
}

// Where the engine's endpoints do not say, the launch argument does.
func TestMaxModelLenFromLaunchArgs(t *testing.T) {
	models := func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"data":[{"id":"Qwen/Qwen3-8B","owned_by":"sglang"}]}`)
	}
	srv := startFake(t, "sglang", map[string]http.HandlerFunc{"/v1/models": models})
	e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxModelLen != 0 {
		t.Fatalf("the fake's /server_info sets no context_length, yet max model len %d from %q", e.MaxModelLen, e.MaxModelLenSource)
	}
	info := func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"model_path":"Qwen/Qwen3-8B","tp_size":1,"dp_size":1,"context_length":32768,"version":"0.5.4"}`)
	}
	srv = startFake(t, "sglang", map[string]http.HandlerFunc{"/v1/models": models, "/server_info": info})
	e = newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
	if e.MaxModelLen != 32768 || e.MaxModelLenSource != SourceServerInfo {
		t.Errorf("max model len %d from %q, want 32768 from server_info", e.MaxModelLen, e.MaxModelLenSource)
	}
}

// Each kind's tokenizer endpoint counts a prompt as its chat endpoint
// does: the chat count exactly (vLLM), the text alone elsewhere.
func TestTokenizersCountLikeUsage(t *testing.T) {
	const text = "the quick brown fox jumps over the lazy dog"
	for _, kind := range []string{sim.FlavorVLLM, sim.FlavorSGLang, sim.FlavorLlamaCpp, sim.FlavorOllama, sim.FlavorMLX} {
		t.Run(kind, func(t *testing.T) {
			s := startSimEngine(t, sim.Config{Flavor: kind})
			form, tok, err := PrefillFor(kind)
			if err != nil {
				t.Fatal(err)
			}
			usage := chatPromptTokens(t, s.URL(), form, text)
			if tok == nil {
				if kind != sim.FlavorOllama && kind != sim.FlavorMLX {
					t.Fatalf("%s has a tokenizer endpoint but no Tokenizer", kind)
				}
				return
			}
			body, _ := json.Marshal(tok.Body(sim.DefaultModel, text))
			resp, err := http.Post(s.URL()+tok.Path, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			n, err := tok.Count(answer)
			if err != nil {
				t.Fatalf("count %s: %v", answer, err)
			}
			words := len(strings.Fields(text))
			switch {
			case tok.Chat && n != usage:
				t.Errorf("chat count %d, usage %d", n, usage)
			case !tok.Chat && n != words:
				t.Errorf("text count %d, want %d words (usage with the template: %d)", n, words, usage)
			}
		})
	}
}

// chatPromptTokens sends text as one user message asking for one token,
// the prefill form's way, and returns usage.prompt_tokens.
func chatPromptTokens(t *testing.T, base string, form OutputForm, text string) int {
	t.Helper()
	req := map[string]any{"model": sim.DefaultModel, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": text}}}
	if form.Fields != nil {
		for k, v := range form.Fields(1) {
			req[k] = v
		}
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %v", resp.StatusCode, err)
	}
	if out.Usage.CompletionTokens != 1 {
		t.Errorf("the prefill form asked for one output token, got %d", out.Usage.CompletionTokens)
	}
	return out.Usage.PromptTokens
}

func TestPrefillFor(t *testing.T) {
	for _, tt := range []struct {
		kind   string
		exact  bool
		fields map[string]any
		tok    bool
	}{
		{wire.EngineVLLM, true, map[string]any{"min_tokens": 1, "ignore_eos": true}, true},
		{wire.EngineSGLang, true, map[string]any{"min_tokens": 1, "ignore_eos": true}, true},
		{wire.EngineLlamaCpp, true, map[string]any{"n_predict": 1, "ignore_eos": true}, true},
		{wire.EngineMLX, false, nil, false},
		{wire.EngineOllama, false, nil, false},
		{"", true, map[string]any{"min_tokens": 1, "n_predict": 1, "ignore_eos": true}, false},
	} {
		f, tok, err := PrefillFor(tt.kind)
		if err != nil {
			t.Fatalf("%q: %v", tt.kind, err)
		}
		var got map[string]any
		if f.Fields != nil {
			got = f.Fields(1)
		}
		if f.Exact != tt.exact || !reflect.DeepEqual(got, tt.fields) || (tok != nil) != tt.tok {
			t.Errorf("%q: exact %v fields %v tokenizer %v", tt.kind, f.Exact, got, tok != nil)
		}
	}
	if _, _, err := PrefillFor("tgi-like"); err == nil {
		t.Error("an unknown kind has a prefill form")
	}
}

func TestTokenizerCountRefusesNonsense(t *testing.T) {
	for _, answer := range []string{`<html>busy</html>`, `{"count":-4}`, `{}`, `not json`} {
		if n, err := countField([]byte(answer)); err == nil {
			t.Errorf("%s: count %d, want an error", answer, n)
		}
	}
	if n, err := countField([]byte(`{"tokens":[1,2,3]}`)); err != nil || n != 3 {
		t.Errorf("llama.cpp tokens: %d %v", n, err)
	}
}
