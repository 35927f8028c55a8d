package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Flavours the sim can imitate.
const (
	FlavorVLLM     = "vllm"
	FlavorSGLang   = "sglang"
	FlavorMLX      = "mlx"
	FlavorLlamaCpp = "llamacpp"
	FlavorOllama   = "ollama"
)

// Flavors lists every flavour, in a stable order.
var Flavors = []string{FlavorVLLM, FlavorSGLang, FlavorMLX, FlavorLlamaCpp, FlavorOllama}

// Defaults.
const (
	DefaultModel    = "Qwen/Qwen3-8B"
	DefaultKVTokens = 100000
	// DefaultMaxTokens caps a response whose request names no max tokens.
	DefaultMaxTokens = 512
	// NaturalMin and NaturalMax bound the pseudo-random natural length of
	// a response that may end early: uniform in [NaturalMin, NaturalMax).
	NaturalMin = 24
	NaturalMax = 512

	maxDP = 64

	// SGLang's scheduler writes its load gauges every 40 decode steps
	// (--decode-log-interval) and, while idle, every 30 s
	// (_maybe_log_idle_metrics).
	defaultDecodeLogInterval = 40
	defaultIdleLogEvery      = 30 * time.Second
)

var defaultVersions = map[string]string{
	FlavorVLLM:     "0.12.0",
	FlavorSGLang:   "0.5.5",
	FlavorMLX:      "0.28.3",
	FlavorLlamaCpp: "b6800",
	FlavorOllama:   "0.13.0",
}

// Running-sequence caps per rank, after the engines' own defaults where
// they do not stop a 16-request burst from running together (llama.cpp's
// --parallel and Ollama's OLLAMA_NUM_PARALLEL default lower in reality).
var defaultMaxRunning = map[string]int{
	FlavorVLLM:     256,
	FlavorSGLang:   2048,
	FlavorMLX:      32,
	FlavorLlamaCpp: 16,
	FlavorOllama:   16,
}

// A step's token budget per rank, after each engine's default: vLLM's
// max_num_batched_tokens (2,048 on GPUs under 70 GiB), SGLang's
// chunked_prefill_size (2,048 on such GPUs), llama.cpp's n_batch, Ollama's
// num_batch and mlx-lm's prefill_step_size.
var defaultBatchedTokens = map[string]int{
	FlavorVLLM:     2048,
	FlavorSGLang:   2048,
	FlavorMLX:      2048,
	FlavorLlamaCpp: 2048,
	FlavorOllama:   512,
}

// mixedSteps reports whether a flavour puts decode tokens and prompt chunks
// in one step (vLLM's chunked prefill, llama.cpp's and Ollama's batches).
// SGLang (without --enable-mixed-chunk) and mlx-lm run a waiting prompt's
// chunks in steps of their own, and decoding waits for them.
func mixedSteps(flavor string) bool { return flavor != FlavorSGLang && flavor != FlavorMLX }

// prefixBlock is the granularity of a flavour's prefix cache: vLLM caches
// whole blocks of 16 tokens, the others single tokens.
func prefixBlock(flavor string) int {
	if flavor == FlavorVLLM {
		return vllmBlockSize
	}
	return 1
}

// Config describes one simulated engine. The zero value of every field
// but SingleTPS and Batch16TPS has a usable default.
type Config struct {
	Flavor  string // "vllm" (default) | "sglang" | "mlx" | "llamacpp" | "ollama"
	Model   string // default "Qwen/Qwen3-8B"
	Version string // engine version to report (--engine-version); default per flavour

	SingleTPS  float64 // one request alone decodes at this many tok/s
	Batch16TPS float64 // 16 together decode at this many tok/s in total (per rank)

	DP       int     // data-parallel ranks, default 1 (vllm and sglang only)
	KVTokens []int64 // pool per rank; default 100000 each; len 1 (all ranks) or DP

	// Steps are ColdFactor times slower for the first ColdSeconds after start.
	ColdFactor  float64
	ColdSeconds float64

	// Slow throttles the engine mid-run: from SlowAt after start every
	// step is SlowFactor times slower (slow.go).
	Slow Slow

	LogPath string // write the flavour's start-up log here ("" = none); truncated first
	// LogNaming is how the log names the ranks (naming.go: NamingNewest,
	// NamingEngineCoreN, NamingDPAttention, NamingRouter).
	LogNaming string
	// MultiNode makes a vLLM sim one node of a multi-node data-parallel
	// deployment (naming.go).
	MultiNode MultiNode

	// PrefillTPS is how many prompt tokens per second a rank reads when it
	// prefills alone; 0 keeps prefill free (the decode-only model).
	PrefillTPS float64
	// MaxBatchedTokens is a step's token budget per rank; 0 = the flavour's
	// default (see defaultBatchedTokens).
	MaxBatchedTokens int
	// MaxModelLen is vLLM's max_model_len or SGLang's context_length; 0 =
	// the model's 40,960, on vLLM capped at the smallest pool. Other
	// flavours take their context from the pool.
	MaxModelLen int64
	// NoPrefixCache turns the prefix cache off (vLLM
	// --no-enable-prefix-caching, SGLang --disable-radix-cache).
	NoPrefixCache bool
	// ReportCachedTokens adds usage.prompt_tokens_details.cached_tokens
	// (vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report).
	ReportCachedTokens bool

	// PromptTokens, when > 0, is what every prompt costs, whatever its
	// text. Otherwise a prompt costs what the sim's tokenizer counts (see
	// textTokens): one token per word of up to 8 bytes, + 4 per message + 2.
	PromptTokens int

	// MaxRunning caps the running sequences per rank (vLLM max_num_seqs,
	// SGLang max_running_requests, llama.cpp slots); 0 = flavour default.
	MaxRunning int

	// SpecAccept, above 1, is speculative decoding: each decode step gives
	// a running request this many tokens (its accepted drafts and one
	// more), streamed as one chunk, as vLLM and SGLang do. A step then
	// takes SpecAccept times as long, so SingleTPS and Batch16TPS stay the
	// tokens per second delivered. vLLM's inter-token histogram observes
	// one interval per step; SGLang's adds the step's tokens to its count.
	SpecAccept int

	// DecodeLogInterval is SGLang's --decode-log-interval. Its scheduler
	// writes its load gauges (num_running_reqs, num_queue_reqs, the token
	// usage, gen_throughput) only on a prefill batch and every this many
	// decode steps, and once idle only when IdleLogEvery has passed since
	// the last write; /v1/loads reads the scheduler when asked. 0 =
	// SGLang's 40. The other flavours' gauges are live.
	DecodeLogInterval int
	// IdleLogEvery is that idle interval; 0 = SGLang's 30 s.
	IdleLogEvery time.Duration

	Faults Faults
	Seed   int64 // seeds the natural (early) response lengths
}

// Faults make the sim misbehave on purpose, for probe and agent tests.
type Faults struct {
	IgnoreMinTokens bool          // act as if min_tokens/ignore_eos were absent (ends early)
	UsageExtra      int           // added to every reported usage.completion_tokens
	FailEvery       int           // every Nth chat request answers HTTP 500
	DropStreamAfter int           // streams are cut (connection closed, no [DONE]) after N tokens
	MalformedSSE    bool          // one garbled SSE data line mid-stream
	NotReadyFor     time.Duration // /health answers 503 for this long after start

	TruncatePrompt   int  // silently keep only the first N prompt tokens (usage says N)
	PromptUsageExtra int  // added to every reported usage.prompt_tokens
	PrefillCached    bool // serve every prompt as if cached: no prefill, an instant first token
	RejectLong       int  // prompts above N tokens get the flavour's context-length error

	// LogKVTokens, when set, are the pools the start-up log prints (one
	// value for all ranks, or one per rank) instead of the ranks' real
	// ones, which /metrics and the other endpoints keep serving: a log
	// that is not this engine's current run (vllm and sglang).
	LogKVTokens []int64

	// StaleGaugesOnAbort (vllm): the load gauges are written when a step
	// ends, as vLLM's stats are, and not when requests are aborted, so
	// once every request is aborted at once they go on showing them until
	// a step runs again (vllm issues #22545 and #29928).
	StaleGaugesOnAbort bool
}

// stepModel is the cost model of one rank: a step that gives b sequences a
// token and prefills p prompt tokens takes (t0 + k·b, when b > 0) + p/P
// seconds, times coldFactor while the engine is cold.
type stepModel struct {
	t0, k      float64
	prefillTPS float64 // P; 0 when prefill is free
	start      time.Time
	coldFactor float64
	coldFor    time.Duration
	slow       Slow
}

// seconds is the warm cost of a step, split into its decode and prefill parts.
func (m stepModel) seconds(b int, p int64) (decode, prefill float64) {
	if b > 0 {
		decode = m.t0 + m.k*float64(b)
	}
	if p > 0 {
		prefill = float64(p) / m.prefillTPS
	}
	return decode, prefill
}

// cold is the factor on a step that starts at at.
func (m stepModel) cold(at time.Time) float64 {
	f := m.slow.factor(at.Sub(m.start))
	if at.Sub(m.start) < m.coldFor {
		return m.coldFactor * f
	}
	return f
}

// calibrate solves t0 + k = 1/s1 and t0 + 16k = 16/s16.
func calibrate(s1, s16 float64) (t0, k float64, err error) {
	if !finitePositive(s1) {
		return 0, 0, fmt.Errorf("single-tps must be a positive number, got %v", s1)
	}
	if !finitePositive(s16) {
		return 0, 0, fmt.Errorf("batch16-tps must be a positive number, got %v", s16)
	}
	k = (16/s16 - 1/s1) / 15
	t0 = 1/s1 - k
	if !(k > 0) {
		return 0, 0, fmt.Errorf("batch16-tps %v must be below 16 × single-tps (%v): a step of 16 cannot cost as little as a step of 1", s16, 16*s1)
	}
	if t0 < -1e-12*(1/s1) { // tolerate rounding when s16 == s1
		return 0, 0, fmt.Errorf("batch16-tps %v must be at least single-tps %v: batching cannot make the total slower", s16, s1)
	}
	return max(t0, 0), k, nil
}

func finitePositive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

// normalize validates c and fills in its defaults.
func (c Config) normalize() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Flavor == "" {
		c.Flavor = FlavorVLLM
	}
	if !slices.Contains(Flavors, c.Flavor) {
		bad("unknown flavor %q (want one of %s)", c.Flavor, strings.Join(Flavors, ", "))
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Version == "" {
		c.Version = defaultVersions[c.Flavor]
	}
	if _, _, err := calibrate(c.SingleTPS, c.Batch16TPS); err != nil {
		errs = append(errs, err)
	}
	if c.DP == 0 {
		c.DP = 1
	}
	switch {
	case c.DP < 1 || c.DP > maxDP:
		bad("dp must be between 1 and %d, got %d", maxDP, c.DP)
	case c.DP > 1 && c.Flavor != FlavorVLLM && c.Flavor != FlavorSGLang:
		bad("flavor %s has no data parallelism: dp must be 1, got %d", c.Flavor, c.DP)
	}
	c.validateNaming(bad)
	switch {
	case len(c.KVTokens) == 0:
		c.KVTokens = []int64{DefaultKVTokens}
	case len(c.KVTokens) != 1 && len(c.KVTokens) != c.DP:
		bad("kv-tokens has %d values but dp is %d (give one value for all ranks or one per rank)", len(c.KVTokens), c.DP)
	}
	for i, t := range c.KVTokens {
		if t <= 0 {
			bad("kv-tokens[%d] must be positive, got %d", i, t)
		}
	}
	if len(c.KVTokens) == 1 && c.DP > 1 {
		c.KVTokens = slices.Repeat(c.KVTokens, c.DP)
	} else {
		c.KVTokens = slices.Clone(c.KVTokens)
	}
	if c.ColdFactor == 0 {
		c.ColdFactor = 1
	}
	switch {
	case math.IsNaN(c.ColdFactor) || math.IsInf(c.ColdFactor, 0) || c.ColdFactor < 1:
		bad("cold-factor must be a number ≥ 1, got %v", c.ColdFactor)
	case math.IsNaN(c.ColdSeconds) || math.IsInf(c.ColdSeconds, 0) || c.ColdSeconds < 0:
		bad("cold-seconds must be a number ≥ 0, got %v", c.ColdSeconds)
	case c.ColdFactor > 1 && c.ColdSeconds == 0:
		bad("cold-factor %v needs cold-seconds > 0", c.ColdFactor)
	}
	if err := c.Slow.normalize(); err != nil {
		bad("%v", err)
	}
	if c.PromptTokens < 0 {
		bad("prompt-tokens must not be negative, got %d", c.PromptTokens)
	}
	if c.MaxRunning < 0 {
		bad("max-running must not be negative, got %d", c.MaxRunning)
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = defaultMaxRunning[c.Flavor]
	}
	switch {
	case c.DecodeLogInterval < 0:
		bad("decode-log-interval must be a number of decode steps above 0, got %d", c.DecodeLogInterval)
	case c.DecodeLogInterval == 0:
		c.DecodeLogInterval = defaultDecodeLogInterval
	}
	switch {
	case c.IdleLogEvery < 0:
		bad("the idle gauge interval must not be negative, got %s", c.IdleLogEvery)
	case c.IdleLogEvery == 0:
		c.IdleLogEvery = defaultIdleLogEvery
	}
	if c.Faults.StaleGaugesOnAbort && c.Flavor != FlavorVLLM {
		bad("the stale-gauges-on-abort fault is vLLM's; flavor %s has none", c.Flavor)
	}
	if c.SpecAccept < 0 || c.SpecAccept > 16 {
		bad("spec-accept must be 0 to 16 tokens per step, got %d", c.SpecAccept)
	}
	if math.IsNaN(c.PrefillTPS) || math.IsInf(c.PrefillTPS, 0) || c.PrefillTPS < 0 {
		bad("prefill-tps must be a number ≥ 0 (0 = prefill is free), got %v", c.PrefillTPS)
	}
	switch {
	case c.MaxBatchedTokens < 0:
		bad("max-batched-tokens must not be negative, got %d", c.MaxBatchedTokens)
	case c.MaxBatchedTokens == 0:
		c.MaxBatchedTokens = defaultBatchedTokens[c.Flavor]
	}
	if c.MaxBatchedTokens > 0 && c.MaxBatchedTokens < c.MaxRunning {
		bad("max-batched-tokens %d must be at least max-running %d: every running sequence needs a token of a step's budget to decode",
			c.MaxBatchedTokens, c.MaxRunning)
	}
	c.normalizeModelLen(bad)
	f := c.Faults
	if f.UsageExtra < 0 || f.FailEvery < 0 || f.DropStreamAfter < 0 || f.NotReadyFor < 0 ||
		f.TruncatePrompt < 0 || f.PromptUsageExtra < 0 || f.RejectLong < 0 {
		bad("fault values must not be negative")
	}
	switch n := len(f.LogKVTokens); {
	case n == 0:
	case c.Flavor != FlavorVLLM && c.Flavor != FlavorSGLang:
		bad("fault-log-kv-tokens: flavor %s prints no per-rank pool", c.Flavor)
	case n != 1 && n != c.DP:
		bad("fault-log-kv-tokens has %d values but dp is %d (give one value for all ranks or one per rank)", n, c.DP)
	case slices.Min(f.LogKVTokens) <= 0:
		bad("fault-log-kv-tokens must be positive")
	case n == 1:
		c.Faults.LogKVTokens = slices.Repeat(f.LogKVTokens, c.DP)
	default:
		c.Faults.LogKVTokens = slices.Clone(f.LogKVTokens)
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("sim config: %w", errors.Join(errs...))
	}
	return c, nil
}

// normalizeModelLen fills in MaxModelLen for vLLM and SGLang. vLLM refuses
// to start when one request of max_model_len tokens would not fit a rank's
// pool; the sim refuses the same way, with vLLM's message.
func (c *Config) normalizeModelLen(bad func(string, ...any)) {
	switch {
	case c.MaxModelLen < 0:
		bad("max-model-len must not be negative, got %d", c.MaxModelLen)
		return
	case c.MaxModelLen > 0 && c.Flavor != FlavorVLLM && c.Flavor != FlavorSGLang:
		bad("flavor %s takes its context from the pool: give --kv-tokens instead of max-model-len", c.Flavor)
		return
	}
	switch c.Flavor {
	case FlavorVLLM:
		smallest := slices.Min(c.KVTokens)
		if smallest <= 0 {
			return // already reported
		}
		if c.MaxModelLen == 0 {
			c.MaxModelLen = min(contextLen, smallest)
		}
		if c.MaxModelLen > smallest {
			bad("To serve at least one request with the models's max seq len (%d), (%.2f GiB KV cache is needed, "+
				"which is larger than the available KV cache memory (%.2f GiB). Based on the available memory, the "+
				"estimated maximum model length is %d. Try increasing `gpu_memory_utilization` or decreasing "+
				"`max_model_len` when initializing the engine.", c.MaxModelLen, kvGiB(c.MaxModelLen), kvGiB(smallest), smallest)
		}
	case FlavorSGLang:
		if c.MaxModelLen == 0 {
			c.MaxModelLen = contextLen
		}
	}
}
