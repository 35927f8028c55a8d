package probe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"heft/shared/wire"
	"heft/sim"
)

// prefillCfg is a short decode burst and the prefill burst of 4 prompts of
// 2,048 tokens.
func prefillCfg(url, kind string) Config {
	return Config{URL: url, Kind: kind, Concurrency: 4, Tokens: 16, CapacityKey: "test/" + kind,
		ReadyTimeout: 10 * time.Second, BurstTimeout: 60 * time.Second,
		Prefill: true, PrefillConcurrency: 4, PrefillTokens: 2048}
}

// prefillSim serves, in the test's synctest bubble (see bubbleSim), a sim
// that decodes in steps of about 20 ms and reads 10,000 prompt tokens a
// second; the config it returns reaches it.
func prefillSim(t *testing.T, kind string, mod func(*sim.Config)) Config {
	t.Helper()
	cfg := sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 50, Batch16TPS: 600, PrefillTPS: 10000}
	if mod != nil {
		mod(&cfg)
	}
	s, client := bubbleSim(t, cfg)
	pc := prefillCfg(s.URL(), kind)
	pc.HTTPClient = client
	return pc
}

// prefillSlack is how far a bubble's prefill reading may be from the
// model's figure for prompts of exactly the asked length: the sims of
// SGLang, llama.cpp, Ollama and mlx read 0.13 % above it (vLLM's exactly),
// the same on every run. Not noise: a wrong figure is off by far more.
const prefillSlack = 0.005

func hasPrefillProblem(m wire.Measurement, substr string) bool {
	return m.Prefill != nil && strings.Contains(strings.Join(m.Prefill.Problems, "\n"), substr)
}

// The prefill burst reads the sim's true prefill capacity, for every kind
// with a prefill rate, whether its prompts are counted by usage alone
// (Ollama, mlx) or by its tokenizer too. In a synctest bubble (see
// bubbleSim) HTTP and JSON of the long prompts take no time on the sim's
// clock, so the measurement is the model's.
func TestSimPrefillIsTrueCapacity(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{sim.FlavorVLLM, sim.FlavorSGLang, sim.FlavorLlamaCpp, sim.FlavorOllama, sim.FlavorMLX} {
		t.Run(kind, func(t *testing.T) {
			simBubble(t, func(t *testing.T) {
				cfg := sim.Config{Flavor: kind, SingleTPS: 50, Batch16TPS: 600, PrefillTPS: 10000}
				s, client := bubbleSim(t, cfg)
				want, err := cfg.PrefillCapacity(4, 2048)
				if err != nil {
					t.Fatal(err)
				}
				pc := prefillCfg(s.URL(), kind)
				pc.HTTPClient = client
				m := mustRun(t, pc)
				if !m.Valid() || !m.PrefillValid() {
					t.Fatalf("decode %q %q; prefill %+v", m.Failure, m.Problems, m.Prefill)
				}
				p := m.Prefill
				t.Logf("prefill %.2f tok/s, the model %.2f", p.ThroughputTPS, want)
				if !within(p.ThroughputTPS, want, prefillSlack) {
					t.Errorf("prefill %v tok/s, want the sim's %v within %v", p.ThroughputTPS, want, prefillSlack)
				}
				if p.PromptLength != 2048 || p.Requests != 4 || p.Concurrency != 4 || p.TokenSource != TokensFromUsage || !p.Complete {
					t.Errorf("prefill part %+v", p)
				}
				// Prompts are sized to the asked length: the sim's tokenizer
				// counts heft's words as one token each.
				if p.PromptTokens != 4*2048 {
					t.Errorf("prompt tokens %d, want %d", p.PromptTokens, 4*2048)
				}
				if got := float64(p.PromptTokens) / p.WallSeconds; got != p.ThroughputTPS {
					t.Errorf("prefill %v is not prompt tokens / wall %v", p.ThroughputTPS, got)
				}
				if p.WarmupTPS <= 0 || p.TTFTP50 <= 0 || p.TTFTP95 < p.TTFTP50 {
					t.Errorf("warm-up %v ttft %v/%v", p.WarmupTPS, p.TTFTP50, p.TTFTP95)
				}
			})
		})
	}
}

// A data-parallel worker splits the prefill burst over its ranks: its
// prefill capacity is twice one rank's, and the probe sees it.
func TestSimPrefillDataParallel(t *testing.T) {
	simBubble(t, func(t *testing.T) {
		cfg := sim.Config{Flavor: sim.FlavorSGLang, DP: 2, SingleTPS: 50, Batch16TPS: 600, PrefillTPS: 10000}
		s, client := bubbleSim(t, cfg)
		want, err := cfg.PrefillCapacity(4, 2048)
		if err != nil {
			t.Fatal(err)
		}
		one := cfg
		one.DP = 1
		single, err := one.PrefillCapacity(4, 2048)
		if err != nil {
			t.Fatal(err)
		}
		pc := prefillCfg(s.URL(), wire.EngineSGLang)
		pc.HTTPClient = client
		m := mustRun(t, pc)
		if !m.PrefillValid() {
			t.Fatalf("prefill %+v", m.Prefill)
		}
		got := m.Prefill.ThroughputTPS
		t.Logf("prefill %.2f tok/s, the model %.2f (one rank %.2f)", got, want, single)
		if !within(got, want, prefillSlack) || want < 1.9*single {
			t.Errorf("prefill %.2f tok/s, want %.2f (two ranks; one gives %.2f)", got, want, single)
		}
	})
}

// Prompts never exceed what the worker can hold: SGLang's small rank
// refuses prompts its pool cannot take, so the probe told the worker's
// max_context_tokens sends shorter ones; not told, it gets refused.
func TestSimPrefillStaysWithinContext(t *testing.T) {
	simBubble(t, func(t *testing.T) { testPrefillStaysWithinContext(t) })
}

func testPrefillStaysWithinContext(t *testing.T) {
	cfg := prefillSim(t, wire.EngineSGLang, func(c *sim.Config) {
		c.Flavor, c.DP, c.KVTokens = sim.FlavorSGLang, 2, []int64{24094, 1500}
	})
	m := mustRun(t, cfg)
	if !m.Valid() || m.Prefill == nil || m.Prefill.Failure != wire.PrefillRejected || m.PrefillValid() {
		t.Fatalf("without the context: decode %q, prefill %+v", m.Failure, m.Prefill)
	}
	if !hasPrefillProblem(m, "Input length") || !hasPrefillProblem(m, "refused") {
		t.Errorf("the rejection does not quote the engine: %q", m.Prefill.Problems)
	}

	cfg.MaxContextTokens = 1500 // wire.Engine.MaxContextTokens of this worker
	m = mustRun(t, cfg)
	if !m.PrefillValid() {
		t.Fatalf("within the context: prefill %+v", m.Prefill)
	}
	if want := 1500 - TemplateMargin - 1; m.Prefill.PromptLength != want || m.Prefill.PromptTokens != 4*want {
		t.Errorf("prompt length %d, tokens %d; want %d each", m.Prefill.PromptLength, m.Prefill.PromptTokens, want)
	}
	if !hasPrefillProblem(m, "max_context_tokens") {
		t.Errorf("no note of the shortened prompts: %q", m.Prefill.Problems)
	}

	cfg.MaxContextTokens = 300 // too small for any prefill burst
	m = mustRun(t, cfg)
	if !m.Valid() || m.Prefill.Failure != wire.PrefillRejected || !hasPrefillProblem(m, "not sent") {
		t.Errorf("a worker too small: decode %q, prefill %+v", m.Failure, m.Prefill)
	}
}

// An engine that misbehaves on long prompts gives a clear prefill failure,
// never a prefill throughput, and its decode measurement stays valid.
func TestSimPrefillBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		kind    string
		mod     func(*sim.Config)
		failure string
		says    string
	}{
		{"rejects long prompts", sim.FlavorVLLM, func(c *sim.Config) { c.Faults.RejectLong = 1024 },
			wire.PrefillRejected, "maximum context length"},
		{"truncates prompts", sim.FlavorVLLM, func(c *sim.Config) { c.Faults.TruncatePrompt = 1000 },
			wire.PrefillTruncated, "cut the prompts"},
		{"truncates, no tokenizer", sim.FlavorOllama, func(c *sim.Config) { c.Faults.TruncatePrompt = 1000 },
			wire.PrefillTruncated, "cut the prompts"},
		{"reports extra prompt tokens", sim.FlavorVLLM, func(c *sim.Config) { c.Faults.PromptUsageExtra = 100 },
			wire.PrefillUsageMismatch, "more prompt tokens than were sent"},
		{"reports extra, text tokenizer", sim.FlavorSGLang, func(c *sim.Config) { c.Faults.PromptUsageExtra = 400 },
			wire.PrefillUsageMismatch, "more prompt tokens than were sent"},
		// A cache's answer is judged against the decode step (50 ms).
		{"serves prompts from a cache", sim.FlavorVLLM, func(c *sim.Config) { c.Faults.PrefillCached, c.SingleTPS, c.Batch16TPS = true, 20, 240 },
			wire.PrefillCached, "cannot have read the prompt"},
		{"reads prompts for free", sim.FlavorSGLang, func(c *sim.Config) { c.PrefillTPS, c.SingleTPS, c.Batch16TPS = 0, 20, 240 },
			wire.PrefillCached, "cannot have read the prompt"},
		// Requests 1–8 are the decode bursts, 9–12 the prefill warm-up:
		// the 13th is the first of the measured prefill burst.
		{"fails a request", sim.FlavorVLLM, func(c *sim.Config) { c.Faults.FailEvery = 13 },
			wire.CodeProbeFailed, "1 of 4 measured prefill requests failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			simBubble(t, func(t *testing.T) {
				m := mustRun(t, prefillSim(t, tc.kind, func(c *sim.Config) { c.Flavor = tc.kind; tc.mod(c) }))
				if !m.Valid() {
					t.Fatalf("the decode part failed too: %q %q", m.Failure, m.Problems)
				}
				p := m.Prefill
				if p == nil || p.Failure != tc.failure || p.ThroughputTPS != 0 || m.PrefillValid() || p.Complete {
					t.Fatalf("prefill %+v, want failure %s and no throughput", p, tc.failure)
				}
				if !strings.Contains(p.Problems[0], tc.says) {
					t.Errorf("first problem %q does not say %q", p.Problems[0], tc.says)
				}
			})
		})
	}
}

// prefillFake is a fake engine whose chat answers count the prompt as
// heft-sim does (a word a token, + 6 for the template) and report it as
// usage says; it can leave prompt_tokens out, report a cache hit, and
// serve a /tokenize.
type prefillFake struct {
	noPromptUsage bool
	cachedShare   float64
	tokenizer     bool
	tokenizes     atomic.Int64
}

func (pf *prefillFake) start(t *testing.T) *fakeEngine {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(_ int64, w http.ResponseWriter, _ *http.Request, req map[string]any) {
			n := intField(req, "max_tokens")
			prompt := promptTokensOf(req)
			// Reading a prompt takes time, 50 µs a token, as on an engine
			// that reads 20,000 tok/s: a long prompt's first token comes
			// later than a short one's.
			time.Sleep(time.Duration(prompt) * 50 * time.Microsecond)
			startStream(w)
			for i := range n {
				writeChunk(w, fmt.Sprintf("t%d", i))
			}
			usage := fmt.Sprintf(`"completion_tokens":%d`, n)
			if !pf.noPromptUsage {
				usage += fmt.Sprintf(`,"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}`, prompt, int(pf.cachedShare*float64(prompt)))
			}
			writeEvent(w, `{"choices":[],"usage":{`+usage+`}}`)
			writeEvent(w, "[DONE]")
		}
	})
	if pf.tokenizer {
		// The fake's mux is fixed; serve /tokenize through a wrapper.
		mux := http.NewServeMux()
		mux.Handle("/", f.srv.Config.Handler)
		mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
			pf.tokenizes.Add(1)
			var req map[string]any
			_ = json.NewDecoder(r.Body).Decode(&req)
			fmt.Fprintf(w, `{"count":%d,"max_model_len":40960}`, promptTokensOf(req))
		})
		f.srv.Config.Handler = mux
	}
	return f
}

// promptTokensOf counts a chat (or vLLM tokenize) request's messages as
// heft-sim's tokenizer does for words of up to 8 bytes.
func promptTokensOf(req map[string]any) int {
	msgs, _ := req["messages"].([]any)
	n := 2
	for _, m := range msgs {
		content, _ := m.(map[string]any)["content"].(string)
		n += 4 + len(strings.Fields(content))
	}
	return n
}

func TestPrefillCostsTwoBursts(t *testing.T) {
	pf := &prefillFake{tokenizer: true}
	f := pf.start(t)
	m := mustRun(t, prefillCfg(f.URL(), wire.EngineVLLM))
	if !m.PrefillValid() {
		t.Fatalf("prefill %+v", m.Prefill)
	}
	// Two decode bursts of 4, two prefill bursts of 4, and not one request
	// more; the tokenizer counts one prompt to size them and the four
	// measured ones before they are sent.
	if n := f.chats.Load(); n != 16 {
		t.Errorf("engine got %d chat requests, want 2 decode + 2 prefill bursts of 4", n)
	}
	if n := pf.tokenizes.Load(); n != 5 {
		t.Errorf("tokenizer asked %d times, want 5", n)
	}
	// Every prompt of the probe is its own: no two begin alike, and the
	// prefill requests ask for one token the kind's exact way.
	firsts := map[string]bool{}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bodies[8:] {
		content := b["messages"].([]any)[0].(map[string]any)["content"].(string)
		first := strings.Fields(content)[0]
		if firsts[first] {
			t.Errorf("two prompts begin with %q", first)
		}
		firsts[first] = true
		if b["max_tokens"] != 1.0 || b["min_tokens"] != 1.0 || b["ignore_eos"] != true {
			t.Errorf("prefill request asks %v/%v/%v", b["max_tokens"], b["min_tokens"], b["ignore_eos"])
		}
	}
	if len(firsts) != 8 {
		t.Errorf("%d distinct prompt starts, want 8", len(firsts))
	}
}

func TestPrefillWithoutPromptUsage(t *testing.T) {
	// With a tokenizer, the prompts are counted before they are sent.
	pf := &prefillFake{noPromptUsage: true, tokenizer: true}
	m := mustRun(t, prefillCfg(pf.start(t).URL(), wire.EngineVLLM))
	p := m.Prefill
	if !m.PrefillValid() || p.TokenSource != TokensFromTokenizer || p.Complete || p.PromptTokens != 4*2048 {
		t.Fatalf("prefill %+v, want a valid, incomplete measurement counted by the tokenizer", p)
	}
	if !hasPrefillProblem(m, "counted with its tokenizer") {
		t.Errorf("problems %q", p.Problems)
	}
	// Without one, it is incomplete and has no throughput.
	pf = &prefillFake{noPromptUsage: true}
	m = mustRun(t, prefillCfg(pf.start(t).URL(), wire.EngineVLLM))
	if !m.Valid() || m.Prefill.Failure != wire.CodeProbeIncompleteOutput || m.PrefillValid() {
		t.Fatalf("decode %q, prefill %+v", m.Failure, m.Prefill)
	}
	if !hasPrefillProblem(m, "no prompt usage") || !hasPrefillProblem(m, "tokenizer did not count") {
		t.Errorf("problems %q", m.Prefill.Problems)
	}
}

func TestPrefillReportedCacheHit(t *testing.T) {
	pf := &prefillFake{cachedShare: 0.9}
	m := mustRun(t, prefillCfg(pf.start(t).URL(), wire.EngineVLLM))
	if !m.Valid() || m.Prefill.Failure != wire.PrefillCached || m.Prefill.CachedTokens == 0 {
		t.Fatalf("prefill %+v", m.Prefill)
	}
	if !strings.Contains(m.Prefill.Problems[0], "cache served") {
		t.Errorf("problems %q", m.Prefill.Problems)
	}
}

// A failed decode burst sends no prefill burst: its number would be of no
// use to a worker that is held.
func TestNoPrefillAfterFailedDecode(t *testing.T) {
	f := newFake(t, func(f *fakeEngine) {
		f.stream = func(_ int64, w http.ResponseWriter, _ *http.Request, req map[string]any) {
			writeStream(w, intField(req, "max_tokens")-1, -1)
		}
	})
	m := mustRun(t, prefillCfg(f.URL(), wire.EngineVLLM))
	if m.Valid() || m.Prefill != nil {
		t.Fatalf("decode %q, prefill %+v", m.Failure, m.Prefill)
	}
	if n := f.chats.Load(); n != 8 {
		t.Errorf("%d chat requests, want the two decode bursts only", n)
	}
}

func TestPrefillConfigLimits(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.PrefillConcurrency = MaxPrefillConcurrency + 1 },
		func(c *Config) { c.PrefillTokens = MinPrefillTokens - 1 },
		func(c *Config) { c.PrefillTokens = MaxPrefillTokens + 1 },
		func(c *Config) { c.MaxContextTokens = -1 },
	} {
		cfg := prefillCfg("http://127.0.0.1:1", wire.EngineVLLM)
		mod(&cfg)
		if _, err := Run(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "probe:") {
			t.Errorf("%+v: err %v", cfg, err)
		}
	}
}

func TestPromptWords(t *testing.T) {
	seen := map[string]bool{}
	for _, w := range promptWords {
		if w == "" || len(w) > 8 || strings.ContainsAny(w, " \t\n") || seen[w] {
			t.Errorf("word %q: empty, longer than 8 bytes, spaced or repeated", w)
		}
		seen[w] = true
	}
	s := newPromptSet(4)
	if got := len(strings.Fields(s.text(3, 100))); got != 100 {
		t.Errorf("%d words, want 100", got)
	}
	first, again, other := s.text(1, 50), s.text(1, 50), s.text(2, 50)
	if first != again || first == other {
		t.Error("a prompt must be the same each time it is made, and differ from the others")
	}
}
