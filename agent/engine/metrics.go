package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/shared/wire"
)

// MaxBodyBytes bounds every response body the agent reads from an engine.
const MaxBodyBytes = 8 << 20

// maxCount bounds request counts read from metrics; anything larger is a
// broken exporter, not a busy engine.
const maxCount = 1 << 24

// maxKVTokens bounds a pool size read from metrics or endpoints.
const maxKVTokens = 1 << 40

// MetricsFacts is what one scrape of an engine's /metrics tells.
type MetricsFacts struct {
	// Load is per rank where the engine labels its series by rank
	// (vLLM engine="k", SGLang dp_rank="k"); series without a rank
	// label count as rank 0.
	Load wire.Load
	// Ranks are KV pools per rank, only where the metrics are truthful:
	// SGLang's sglang:max_total_num_tokens{dp_rank}. Never vLLM's
	// cache_config_info, whose num_gpu_blocks is the sum over DP ranks.
	Ranks []wire.Rank
	// Models are the model_name label values seen, sorted.
	Models []string
	// Families is how many metric families the page held.
	Families int
	// LoadUnreadable: the page has the kind's load series, but none of
	// their samples can be used, so Load is not known though the engine
	// has one (LoadOf).
	LoadUnreadable bool
	// Generated is the engine's generated-tokens counter summed over its
	// ranks, where GeneratedKnown: the probe compares it with what its
	// burst received, and passive capacity reads it over a window. For
	// SGLang, whose counter moves only when a request finishes, it is the
	// tokens sent so far, from its histograms' counts (generatedAtFinish).
	Generated      float64
	GeneratedKnown bool
	// GeneratedLive: Generated moves as tokens are made (vLLM's counter,
	// SGLang's histograms), not as requests finish (llama.cpp's counter,
	// SGLang's before it had an inter-token histogram).
	GeneratedLive bool
	// GeneratedRanks is the counter per rank where the engine labels it
	// by rank (vLLM engine="k"); one entry, rank 0, otherwise.
	GeneratedRanks map[int]float64
	// InterTokenSeconds and InterTokens are the inter-token latency
	// histogram's sum and count over every rank, or the decode seconds and
	// generated tokens of finished requests (llama.cpp), where
	// InterTokenKnown.
	InterTokenSeconds, InterTokens float64
	InterTokenKnown                bool
	// FirstTokens counts requests that got their first token (the
	// time-to-first-token histogram's count), where FirstTokensKnown: the
	// generated counter less it is the tokens made after requests' first,
	// which the inter-token histogram's count undercounts where a step
	// gives a request several (vLLM with speculative decoding observes one
	// interval per step).
	FirstTokens      float64
	FirstTokensKnown bool
	// InterTokenLive: the histogram grows as tokens are sent, its sum the
	// time between two tokens of a request and its count the tokens (vLLM,
	// SGLang's inter_token_latency_seconds). Its rise over a span, over the
	// span's length, is then how many requests were decoding (Little's
	// law); not so for a count of chunks or of finished requests.
	InterTokenLive bool
	// PromptComputed is the prompt tokens the engine has read, over its
	// ranks, less those its prefix cache served, where PromptKnown: the
	// prefill that shares the steps with decoding (pace.go in agent).
	PromptComputed float64
	PromptKnown    bool
}

// metricNames says which series of a kind's /metrics carry what (each
// kind's descriptor has its own). The first name found wins, so a newer name comes before its deprecated one.
type metricNames struct {
	rankLabel string
	running   []string
	waiting   []string
	// liveLoad, where set, reads the load as the engine has it now, for a
	// kind whose running and waiting gauges are written late (SGLang's);
	// ok false where it cannot, and the gauges stand.
	liveLoad  func(ctx context.Context, c *Client) (l wire.Load, ok bool)
	kvUsage   []string // a 0..1 fraction
	pool      []string // per-rank KV pool in tokens (truthful only)
	generated []string // counter of generated tokens
	// interToken is a histogram of the time between two tokens of one
	// request, observed as they are sent; its sum over its count is the
	// step time running requests see. meanInterToken, where interToken is
	// missing, is a histogram whose sum over its count is that time too,
	// but whose count is not tokens (older SGLang).
	interToken, meanInterToken []string
	// firstToken is a histogram with one observation per request's first
	// token (time to first token).
	firstToken []string
	// generatedAtFinish: the generated counter adds a request's tokens
	// only when it finishes (SGLang's tokenizer, llama.cpp), which says nothing of
	// the tokens of requests still running; where the live interToken and
	// firstToken are both there, their counts together are the tokens
	// sent.
	generatedAtFinish bool
	// decodeSeconds, for an engine without that histogram, is a counter of
	// the seconds finished requests spent decoding, from their first token
	// to their last, whose tokens the generated counter holds (llama.cpp
	// adds both when a request finishes): its rise over the generated
	// counter's is the same mean time between two tokens of one request,
	// short by one interval in each request's tokens.
	decodeSeconds []string
	// prompt counts prompt tokens read (vLLM when a prompt's prefill
	// ends, SGLang when its request finishes, llama.cpp those evaluated);
	// cached, where the engine has it, those its prefix cache served.
	prompt, cached []string
	// cacheInfo is a family whose block_size label gives the KV block
	// size: a cached family whose HELP says it counts blocks (vLLM 0.8's
	// gpu_prefix_cache_hits) is counted in blocks of that size.
	cacheInfo string
}

// errLoadUnreadable is a load the engine serves that cannot be read.
var errLoadUnreadable = errors.New("its /metrics has load series, but no sample of them can be used (NaN, negative, or a rank label that is no number)")

// LoadOf is the load a scrape gives: an error where it has load series
// that cannot be read.
func (mf MetricsFacts) LoadOf() (wire.Load, error) {
	if mf.LoadUnreadable {
		return wire.Load{}, errLoadUnreadable
	}
	return mf.Load, nil
}

// LoadNotServed reports a Load error that says the engine serves no load
// at all (no /metrics, no load endpoint), rather than a load that could
// not be read this time.
func LoadNotServed(err error) bool {
	return errors.Is(err, errNotServed) || errors.Is(err, ErrNoMetrics)
}

// ErrNoMetrics is returned for an engine kind that has no /metrics
// (mlx-lm's server, Ollama).
var ErrNoMetrics = errors.New("this engine kind has no /metrics endpoint")

// ParseMetrics reads one Prometheus text page from an engine of the given
// kind. A page that does not parse is an error; a page that parses but
// holds none of the kind's series gives facts with Load.Known false.
// Values that are not finite, negative, or absurdly large are ignored.
func ParseMetrics(kind string, r io.Reader) (MetricsFacts, error) {
	d, ok := lookup(kind)
	if !ok {
		return MetricsFacts{}, fmt.Errorf("unknown engine kind %q", kind)
	}
	if d.metrics == nil {
		return MetricsFacts{}, fmt.Errorf("%s: %w", kind, ErrNoMetrics)
	}
	names := *d.metrics
	body, err := readBounded(r, MaxBodyBytes)
	if err != nil {
		return MetricsFacts{}, err
	}
	if looksLikeHTML(body) {
		return MetricsFacts{}, errors.New("metrics do not parse: the engine answered HTML, not Prometheus text")
	}
	// One parser per scrape: a TextParser keeps state and is not safe
	// for reuse across goroutines. The zero value panics.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return MetricsFacts{}, fmt.Errorf("metrics do not parse: %w", err)
	}

	page := metricsPage{families: families, rankLabel: names.rankLabel, models: map[string]bool{}}
	ranks := map[int]*wire.RankLoad{}
	rank := func(k int) *wire.RankLoad {
		if ranks[k] == nil {
			ranks[k] = &wire.RankLoad{DPRank: k}
		}
		return ranks[k]
	}
	known := false
	page.each(names.running, func(k int, v float64) {
		if v <= maxCount {
			rank(k).Running, known = int(v), true
		}
	})
	page.each(names.waiting, func(k int, v float64) {
		if v <= maxCount {
			rank(k).Waiting, known = int(v), true
		}
	})
	page.each(names.kvUsage, func(k int, v float64) {
		rank(k).KVUsage = min(v, 1)
	})
	pools := map[int]int64{}
	page.each(names.pool, func(k int, v float64) {
		if v <= maxKVTokens {
			pools[k] = int64(v)
		}
	})

	// Load series with samples none of which can be used (NaN, negative,
	// absurd, a rank label that is no number) say the engine has a load
	// heft cannot read: not that it has none.
	facts := MetricsFacts{Families: len(families), LoadUnreadable: !known && page.holds(append(names.running, names.waiting...))}
	facts.GeneratedKnown = page.each(names.generated, func(k int, v float64) {
		if facts.GeneratedRanks == nil {
			facts.GeneratedRanks = map[int]float64{}
		}
		facts.GeneratedRanks[k] = v
		facts.Generated += v
	})
	interToken := func(sum, count float64) {
		facts.InterTokenSeconds += sum
		facts.InterTokens += count
	}
	facts.InterTokenLive = page.histogram(names.interToken, interToken)
	facts.InterTokenKnown = facts.InterTokenLive || page.histogram(names.meanInterToken, interToken)
	facts.FirstTokensKnown = page.histogram(names.firstToken, func(_, count float64) { facts.FirstTokens += count })
	facts.GeneratedLive = facts.GeneratedKnown && !names.generatedAtFinish
	if names.generatedAtFinish && facts.InterTokenLive && facts.FirstTokensKnown {
		facts.Generated, facts.GeneratedKnown, facts.GeneratedLive = facts.FirstTokens+facts.InterTokens, true, true
		facts.GeneratedRanks = map[int]float64{0: facts.Generated}
	}
	if !facts.InterTokenKnown && facts.GeneratedKnown {
		var secs float64
		if page.each(names.decodeSeconds, func(_ int, v float64) { secs += v }) {
			facts.InterTokenSeconds, facts.InterTokens, facts.InterTokenKnown = secs, facts.Generated, true
		}
	}
	var cached float64
	page.each(names.cached, func(_ int, v float64) { cached += v })
	cached *= page.cachedUnit(names)
	facts.PromptKnown = page.each(names.prompt, func(_ int, v float64) { facts.PromptComputed += v })
	facts.PromptComputed = max(0, facts.PromptComputed-cached)
	if known || len(ranks) > 0 {
		facts.Load.Known = known
		for _, k := range sortedKeys(ranks) {
			r := ranks[k]
			facts.Load.Ranks = append(facts.Load.Ranks, *r)
			facts.Load.Running += r.Running
			facts.Load.Waiting += r.Waiting
			facts.Load.KVUsage = max(facts.Load.KVUsage, r.KVUsage)
		}
	}
	for _, k := range sortedKeys(pools) {
		facts.Ranks = append(facts.Ranks, wire.Rank{DPRank: k, KVTokens: pools[k]})
	}
	for m := range page.models {
		facts.Models = append(facts.Models, m)
	}
	sort.Strings(facts.Models)
	return facts, nil
}

// metricsPage is one parsed /metrics page, read family by family.
type metricsPage struct {
	families  map[string]*dto.MetricFamily
	rankLabel string
	models    map[string]bool // model_name label values seen
}

// each calls fn once per usable sample of the first family in list that
// the page holds, and reports whether there was one. Several samples for
// one rank (TP ranks with --enable-metrics-for-all-schedulers) keep the
// largest value.
func (p *metricsPage) each(list []string, fn func(rank int, v float64)) bool {
	for _, name := range list {
		mf, ok := p.families[name]
		if !ok {
			continue
		}
		seen := map[int]float64{}
		for _, m := range mf.GetMetric() {
			v, ok := sampleValue(m)
			if !ok {
				continue
			}
			k, ok := rankOf(m, p.rankLabel)
			if !ok {
				continue
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model_name" && lp.GetValue() != "" && len(p.models) < wire.MaxListItems {
					p.models[lp.GetValue()] = true
				}
			}
			if old, dup := seen[k]; dup && old >= v {
				continue
			}
			seen[k] = v
		}
		if len(seen) == 0 {
			continue // nothing usable: not a reading of it
		}
		for k, v := range seen {
			fn(k, v)
		}
		return true
	}
	return false
}

// holds reports whether the page has samples of a family in list.
func (p *metricsPage) holds(list []string) bool {
	return slices.ContainsFunc(list, func(name string) bool { return len(p.families[name].GetMetric()) > 0 })
}

// defaultBlockSize is vLLM's KV block size where the page does not say.
const defaultBlockSize = 16

// cachedUnit is how many tokens one unit of the kind's cached counter
// (the first family the page holds, as each reads it) stands for: one,
// or a KV block's where its HELP says it counts blocks.
func (p *metricsPage) cachedUnit(names metricNames) float64 {
	for _, name := range names.cached {
		mf, ok := p.families[name]
		if !ok {
			continue
		}
		if !strings.Contains(mf.GetHelp(), "blocks") {
			return 1
		}
		if info, ok := p.families[names.cacheInfo]; ok {
			for _, m := range info.GetMetric() {
				for _, lp := range m.GetLabel() {
					if n, err := strconv.Atoi(lp.GetValue()); lp.GetName() == "block_size" && err == nil && n > 0 && n <= 1024 {
						return float64(n)
					}
				}
			}
		}
		return defaultBlockSize
	}
	return 1
}

// histogram calls fn with the sum and count of every usable series of the
// first histogram family in list that the page holds, and reports whether
// there was one.
func (p *metricsPage) histogram(list []string, fn func(sum, count float64)) bool {
	for _, name := range list {
		mf, ok := p.families[name]
		if !ok || mf.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			sum, count := h.GetSampleSum(), float64(h.GetSampleCount())
			if math.IsNaN(sum) || math.IsInf(sum, 0) || sum < 0 {
				continue
			}
			fn(sum, count)
		}
		return true
	}
	return false
}

// sampleValue returns a gauge, counter or untyped value when it is finite
// and not negative.
func sampleValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false
	}
	return v, true
}

// rankOf reads the rank label; a series without it is rank 0. A label
// that is not a small non-negative integer disqualifies the sample.
func rankOf(m *dto.Metric, label string) (int, bool) {
	if label == "" {
		return 0, true
	}
	for _, lp := range m.GetLabel() {
		if lp.GetName() != label {
			continue
		}
		k, err := strconv.Atoi(lp.GetValue())
		if err != nil || k < 0 || k >= wire.MaxRanks {
			return 0, false
		}
		return k, true
	}
	return 0, true
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}

// readBounded reads all of r, failing when it holds more than limit bytes.
func readBounded(r io.Reader, limit int64) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("answer larger than %d MiB", limit>>20)
	}
	return body, nil
}

// looksLikeHTML is true for a body that starts (after blanks) with a tag.
// Neither JSON nor Prometheus text can start with '<', so a proxy's or a
// web UI's page is told apart from a garbled answer.
func looksLikeHTML(body []byte) bool {
	b := bytes.TrimLeft(body, " \t\r\n")
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	return len(b) > 0 && b[0] == '<'
}
