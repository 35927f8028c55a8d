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

// Config describes one simulated engine. The zero value of every field
// but SingleTPS and Batch16TPS has a usable default.
type Config struct {
	Flavor  string // "vllm" (default) | "sglang" | "mlx" | "llamacpp" | "ollama"
	Model   string // default "Qwen/Qwen3-8B"
	Version string // engine version to report; default per flavour

	SingleTPS  float64 // one request alone decodes at this many tok/s
	Batch16TPS float64 // 16 together decode at this many tok/s in total (per rank)

	DP       int     // data-parallel ranks, default 1 (vllm and sglang only)
	KVTokens []int64 // pool per rank; default 100000 each; len 1 (all ranks) or DP

	// Steps are ColdFactor times slower for the first ColdSeconds after start.
	ColdFactor  float64
	ColdSeconds float64

	LogPath string // write the flavour's start-up log here ("" = none); truncated first

	// PromptTokens, when > 0, is what every prompt costs in the pool.
	// Otherwise a prompt costs ceil(1.3 × words) + 4 per message + 2.
	PromptTokens int

	// MaxRunning caps the running sequences per rank (vLLM max_num_seqs,
	// SGLang max_running_requests, llama.cpp slots); 0 = flavour default.
	MaxRunning int

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
}

// stepModel is the decode cost model of one rank: a step of b sequences
// takes t0 + k·b seconds, times coldFactor while the engine is cold.
type stepModel struct {
	t0, k      float64
	start      time.Time
	coldFactor float64
	coldFor    time.Duration
}

func (m stepModel) duration(b int, at time.Time) time.Duration {
	sec := m.t0 + m.k*float64(b)
	if at.Sub(m.start) < m.coldFor {
		sec *= m.coldFactor
	}
	return time.Duration(sec * float64(time.Second))
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
	if c.PromptTokens < 0 {
		bad("prompt-tokens must not be negative, got %d", c.PromptTokens)
	}
	if c.MaxRunning < 0 {
		bad("max-running must not be negative, got %d", c.MaxRunning)
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = defaultMaxRunning[c.Flavor]
	}
	f := c.Faults
	if f.UsageExtra < 0 || f.FailEvery < 0 || f.DropStreamAfter < 0 || f.NotReadyFor < 0 {
		bad("fault values must not be negative")
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("sim config: %w", errors.Join(errs...))
	}
	return c, nil
}
