package sim

import (
	"math"
	"time"
)

// itlBuckets are the upper bounds of the inter-token latency histogram, in
// seconds: vLLM's (vllm/v1/metrics/loggers.py) and close to SGLang's.
var itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}

// ttftBuckets are SGLang's time-to-first-token bounds, in seconds.
var ttftBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}

// itlHist is a histogram of the time between two tokens of one sequence,
// as vLLM (vllm:inter_token_latency_seconds, per engine) and SGLang
// (sglang:inter_token_latency_seconds) keep it: one observation per token
// after a sequence's first. Its sum over its count is the mean step time
// a running sequence sees, which a throttle stretches at any batch size.
// The same type, with ttftBuckets, keeps SGLang's time to first token.
type itlHist struct {
	bounds []float64 // nil: itlBuckets
	counts []int64   // per bucket, not cumulative
	sum    float64
	n      int64
}

func (h *itlHist) buckets() []float64 {
	if h.bounds == nil {
		return itlBuckets
	}
	return h.bounds
}

func (h *itlHist) observe(d time.Duration) { h.observeTokens(d, 1) }

// observeTokens is k tokens of one sequence that came together after d:
// SGLang's tokenizer adds d to the sum and k observations of d/k.
func (h *itlHist) observeTokens(d time.Duration, k int) {
	k = max(k, 1)
	if h.counts == nil {
		h.counts = make([]int64, len(h.buckets()))
	}
	h.sum += d.Seconds()
	h.n += int64(k)
	each := d.Seconds() / float64(k)
	for i, le := range h.buckets() {
		if each <= le {
			h.counts[i] += int64(k)
			return
		}
	}
}

func (h itlHist) clone() itlHist {
	h.counts = append([]int64(nil), h.counts...)
	return h
}

// histogram writes one histogram series (buckets, +Inf, sum, count) with labels.
func (p *promText) histogram(name string, labels []promLabel, h itlHist) {
	cum := int64(0)
	for i, le := range h.buckets() {
		if i < len(h.counts) {
			cum += h.counts[i]
		}
		p.sample(name+"_bucket", append(append([]promLabel(nil), labels...), promLabel{"le", promFloat(le)}), float64(cum))
	}
	p.sample(name+"_bucket", append(append([]promLabel(nil), labels...), promLabel{"le", promFloat(math.Inf(1))}), float64(h.n))
	p.sample(name+"_sum", labels, h.sum)
	p.sample(name+"_count", labels, float64(h.n))
}

// add merges o into h (ranks into one engine-wide histogram).
func (h *itlHist) add(o itlHist) {
	if h.counts == nil {
		h.bounds = o.bounds
		h.counts = make([]int64, len(h.buckets()))
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.sum += o.sum
	h.n += o.n
}
