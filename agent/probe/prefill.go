package probe

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// The prefill burst (issue 13) measures how fast an engine reads long
// prompts: after the decode burst, PrefillConcurrency chat requests at once,
// each with a prompt of PrefillTokens tokens that begins with a unique
// random prefix (so no prefix cache can serve it) and asks for one output
// token. It is sent twice, with new prompts, and the second burst counts:
// its prompt tokens (from usage) over its wall time. The prefill burst costs
// two bursts and one tokenizer call, nothing more: the measured burst's
// prompts are built and counted while the warm-up burst runs.
const (
	DefaultPrefillConcurrency = 4
	DefaultPrefillTokens      = 8192
	// MaxPrefillConcurrency keeps the first words of every prompt of a
	// probe distinct (two bursts from promptWords).
	MaxPrefillConcurrency = 64
	MaxPrefillTokens      = 1 << 18
	// TemplateMargin is what a prompt leaves of the worker's context for the
	// chat template and the one output token: a prompt is never longer than
	// max_context_tokens minus this.
	TemplateMargin = 128
	// MinPrefillTokens is the shortest prompt worth a prefill burst: shorter
	// ones share an engine step with each other and measure something else.
	MinPrefillTokens = 256
)

// Progress phases of the prefill burst.
const (
	PhasePrefillWarmup  = "prefill_warmup"
	PhasePrefillMeasure = "prefill_measure"
)

// Token sources of a prefill measurement.
const (
	TokensFromUsage     = "usage"
	TokensFromTokenizer = "tokenizer"
)

const (
	// templateTokens is heft's estimate of what a chat template adds to
	// one user message (heft-sim: 6; common models: 5 to 15).
	templateTokens = 6
	// cachedShare: a unique prompt of which the engine says its cache
	// served more than this share was not read.
	cachedShare = 0.10
	// cachedSteps: unique prompts of at least cachedTTFTMin tokens whose
	// first tokens come back (median) within this many of the decode
	// burst's steps (the gap between two tokens of one request, at the
	// decode burst's batch) cannot have been read: an engine reads a
	// prompt in steps of at most a few thousand tokens, each at least a
	// decode step long, so reading four long prompts takes tens of steps
	// on any engine heft knows; a cache answers in one or two.
	cachedSteps   = 4
	cachedTTFTMin = 1024
)

func (c *Config) normalizePrefill() error {
	if c.PrefillConcurrency == 0 {
		c.PrefillConcurrency = DefaultPrefillConcurrency
	}
	if c.PrefillTokens == 0 {
		c.PrefillTokens = DefaultPrefillTokens
	}
	if c.PrefillConcurrency < 1 || c.PrefillConcurrency > MaxPrefillConcurrency {
		return fmt.Errorf("probe: prefill concurrency %d is outside 1..%d", c.PrefillConcurrency, MaxPrefillConcurrency)
	}
	if c.PrefillTokens < MinPrefillTokens || c.PrefillTokens > MaxPrefillTokens {
		return fmt.Errorf("probe: prefill tokens %d is outside %d..%d", c.PrefillTokens, MinPrefillTokens, MaxPrefillTokens)
	}
	if c.MaxContextTokens < 0 {
		return errors.New("probe: negative max context tokens")
	}
	return nil
}

// prefill runs the prefill burst into m.Prefill. Whatever goes wrong is
// the prefill part's Failure; m's decode part is left as it is. It returns
// an error only when ctx ends.
func (p *prober) prefill(ctx context.Context, m *wire.Measurement) error {
	n := p.cfg.PrefillConcurrency
	pf := &wire.Prefill{Concurrency: n, Requests: n}
	m.Prefill = pf
	defer clipProblems(&pf.Problems)
	form, tok, err := engine.PrefillFor(p.cfg.Kind)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	length := p.prefillLength(pf)
	if pf.Failure != "" {
		return nil
	}
	pf.PromptLength = length
	pl := prefillPlan{form: form, tok: tok, model: m.Model, prompts: newPromptSet(2 * n), words: length - templateTokens,
		estimate: estimateFor(length), url: p.cfg.URL + "/v1/chat/completions"}
	if tok != nil {
		pl.words = p.calibrate(ctx, tok, m.Model, pl.prompts, pl.words, length, pf)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	bodies, expects, err := p.prefillWarmup(ctx, pl, pf)
	if err != nil || bodies == nil {
		return err
	}
	meas, err := p.prefillBurst(ctx, PhasePrefillMeasure, pl.url, bodies, expects)
	if err != nil {
		return err
	}
	p.prefillVerdict(m, pf, meas)
	return nil
}

// prefillPlan is what a probe's prefill bursts send: 2n prompts of words
// words, in the kind's request form.
type prefillPlan struct {
	form     engine.OutputForm
	tok      *engine.Tokenizer
	model    string
	prompts  promptSet
	words    int
	estimate promptExpect
	url      string
}

// build makes the requests of prompts from..to-1, and their texts.
func (pl prefillPlan) build(from, to int) ([][]byte, []string, error) {
	bodies, texts := make([][]byte, 0, to-from), make([]string, 0, to-from)
	for i := from; i < to; i++ {
		text := pl.prompts.text(i, pl.words)
		body, err := requestBody(pl.form, pl.model, text, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("probe: build prefill request: %w", err)
		}
		bodies, texts = append(bodies, body), append(texts, text)
	}
	return bodies, texts, nil
}

// prefillWarmup sends the warm-up prefill burst, meanwhile building the
// measured burst's requests and counting their prompts with the tokenizer,
// so that neither adds time of its own to the probe. It returns the
// measured burst's requests and what each prompt should cost; no requests
// (and no error) when the warm-up failed pf.
func (p *prober) prefillWarmup(ctx context.Context, pl prefillPlan, pf *wire.Prefill) ([][]byte, []promptExpect, error) {
	n := pf.Requests
	warmBodies, _, err := pl.build(0, n)
	if err != nil {
		return nil, nil, err
	}
	expects := repeat(pl.estimate, n)
	var measBodies [][]byte
	var buildErr error
	var countProblem string
	var prepare sync.WaitGroup
	prepare.Go(func() {
		var texts []string
		if measBodies, texts, buildErr = pl.build(n, 2*n); buildErr == nil && pl.tok != nil {
			expects, countProblem = p.countPrompts(ctx, pl.tok, pl.model, texts, pl.estimate)
		}
	})
	warm, err := p.prefillBurst(ctx, PhasePrefillWarmup, pl.url, warmBodies, repeat(pl.estimate, n))
	prepare.Wait()
	if countProblem != "" {
		pf.Problems = append(pf.Problems, countProblem)
	}
	switch {
	case err != nil:
		return nil, nil, err
	case buildErr != nil:
		return nil, nil, buildErr
	case ctx.Err() != nil:
		return nil, nil, ctx.Err()
	}
	pf.WarmupTPS = warm.TPS
	for _, line := range append(warm.Errors, warm.Shortfalls...) {
		pf.Problems = append(pf.Problems, "warm-up: "+line)
	}
	switch {
	case warm.Rejected > 0:
		failPrefill(pf, wire.PrefillRejected, fmt.Sprintf("the engine refused %d of %d prompts of %d tokens in the warm-up burst; the measured burst was not sent: %s",
			warm.Rejected, warm.Requests, pf.PromptLength, warm.Rejection))
		return nil, nil, nil
	case warm.Failed == warm.Requests:
		failPrefill(pf, wire.CodeProbeFailed, "every prefill warm-up request failed; the measured burst was not sent")
		return nil, nil, nil
	}
	return measBodies, expects, nil
}

// prefillLength is the prompt length to send: the configured one, or less
// where the worker cannot hold it. A worker too small for any prefill
// burst fails pf.
func (p *prober) prefillLength(pf *wire.Prefill) int {
	length := p.cfg.PrefillTokens
	if limit := p.cfg.MaxContextTokens; limit > 0 && limit-TemplateMargin-1 < int64(length) {
		room := int(max(limit-TemplateMargin-1, 0))
		if room < MinPrefillTokens {
			failPrefill(pf, wire.PrefillRejected, fmt.Sprintf("the worker holds at most %d tokens (max_context_tokens), too few for prompts of at least %d tokens with a margin of %d for the chat template; the prefill burst was not sent",
				limit, MinPrefillTokens, TemplateMargin))
			return 0
		}
		pf.Problems = append(pf.Problems, fmt.Sprintf("prompts of %d tokens, not %d: the worker holds at most %d tokens (max_context_tokens), less a margin of %d for the chat template and the answer",
			room, length, limit, TemplateMargin))
		length = room
	}
	return length
}

// promptExpect is what one prompt should cost, and the usage counts that
// agree with it.
type promptExpect struct {
	tokens int
	lo, hi int
	// counted: tokens is the engine tokenizer's count, usable when usage
	// does not say.
	counted bool
}

// estimateFor is heft's own estimate of a prompt of length tokens: a real
// tokenizer may cost each word a little more or less, so only far-off
// usage disagrees with it.
func estimateFor(length int) promptExpect {
	return promptExpect{tokens: length, lo: length * 3 / 4, hi: length * 3 / 2}
}

// counted is the expectation from a tokenizer's count of a prompt: exact
// for a chat count, a text count plus room for the chat template else.
func counted(tok *engine.Tokenizer, n int) promptExpect {
	tol := max(2, n/200)
	if tok.Chat {
		return promptExpect{tokens: n, lo: n - tol, hi: n + tol, counted: true}
	}
	return promptExpect{tokens: n + templateTokens, lo: n - tol, hi: n + TemplateMargin, counted: true}
}

func repeat(e promptExpect, n int) []promptExpect {
	out := make([]promptExpect, n)
	for i := range out {
		out[i] = e
	}
	return out
}

// calibrate counts the first prompt with the engine's tokenizer and, when
// the words cost more or fewer tokens than heft's estimate, returns the
// word count that makes a prompt of length tokens. A tokenizer that does
// not answer leaves the estimate, noted in pf.
func (p *prober) calibrate(ctx context.Context, tok *engine.Tokenizer, model string, prompts promptSet, words, length int, pf *wire.Prefill) int {
	n, err := p.tokenize(ctx, tok, model, prompts.text(0, words))
	if err != nil {
		pf.Problems = append(pf.Problems, fmt.Sprintf("the engine's tokenizer did not count a prompt (%v); prompts are sized by heft's estimate", err))
		return words
	}
	text := n
	if tok.Chat {
		text = n - templateTokens
	}
	if got := counted(tok, n).tokens; abs(got-length) <= length/200 || text <= 0 {
		return words
	}
	perWord := float64(text) / float64(words)
	return max(1, int(float64(length-templateTokens)/perWord+0.5))
}

// countPrompts counts the measured burst's prompts with the engine's
// tokenizer before they are sent; a prompt it cannot count keeps heft's
// estimate, and the problem says so.
func (p *prober) countPrompts(ctx context.Context, tok *engine.Tokenizer, model string, texts []string, estimate promptExpect) ([]promptExpect, string) {
	out := make([]promptExpect, len(texts))
	var failed error
	for i, text := range texts {
		n, err := p.tokenize(ctx, tok, model, text)
		if err != nil {
			out[i], failed = estimate, err
			continue
		}
		out[i] = counted(tok, n)
	}
	if failed != nil {
		return out, fmt.Sprintf("the engine's tokenizer did not count every prompt (%v); those are judged by heft's estimate", failed)
	}
	return out, ""
}

// tokenize asks the engine's tokenizer endpoint for the tokens of one
// user message of text.
func (p *prober) tokenize(ctx context.Context, tok *engine.Tokenizer, model, text string) (int, error) {
	body, err := json.Marshal(tok.Body(model, text))
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.cfg.URL+tok.Path, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("POST %s: %w", tok.Path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, fmt.Errorf("POST %s: %w", tok.Path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("POST %s answered %s: %s", tok.Path, resp.Status, clip(strings.TrimSpace(string(answer))))
	}
	return tok.Count(answer)
}

// prefillSummary judges one prefill burst.
type prefillSummary struct {
	Requests, Failed int
	// Rejected counts requests the engine refused as too long (HTTP 400,
	// 413 or 422); Rejection is the first one's answer.
	Rejected  int
	Rejection string
	// PromptTokens are the prompt tokens read: usage where reported, else
	// the tokenizer's count.
	PromptTokens, Expected int
	Wall                   time.Duration
	TPS                    float64
	// FromTokenizer counts requests whose tokens came from the tokenizer,
	// NoUsage those with neither usage nor a count.
	FromTokenizer, NoUsage int
	Truncated, Over        int
	Cached                 int
	TTFT                   []float64
	Errors, Shortfalls     []string
}

// summarizePrefill counts a prefill burst's prompt tokens, from the first
// request sent to the last answer, and says what went wrong.
func summarizePrefill(results []reqResult, expects []promptExpect) prefillSummary {
	s := prefillSummary{Requests: len(results)}
	var start, end time.Time
	errs, short := newGrouper(len(results)), newGrouper(len(results))
	for i, r := range results {
		if !r.Sent.IsZero() && (start.IsZero() || r.Sent.Before(start)) {
			start = r.Sent
		}
		exp := expects[i]
		s.Expected += exp.tokens
		if r.Err != nil {
			s.Failed++
			if ae := (*answerError)(nil); errors.As(r.Err, &ae) && (ae.code == 400 || ae.code == 413 || ae.code == 422) {
				s.Rejected++
				if s.Rejection == "" {
					s.Rejection = ae.body
				}
			}
			errs.add(errorClass(r.Err), fmt.Sprintf("request %d: %v", i+1, r.Err))
			continue
		}
		st := r.Stats
		done := st.Done
		if st.LastToken.After(done) {
			done = st.LastToken
		}
		if done.After(end) {
			end = done
		}
		first := st.FirstToken
		if first.IsZero() {
			first = st.Done
		}
		if !first.IsZero() {
			s.TTFT = append(s.TTFT, first.Sub(r.Sent).Seconds())
		}
		s.Cached += st.Cached
		switch {
		case st.HasPromptUsage:
			s.PromptTokens += st.PromptUsage
			switch {
			case st.PromptUsage < exp.lo:
				s.Truncated++
				short.add("truncated", fmt.Sprintf("request %d: usage says %d prompt tokens, %d were sent", i+1, st.PromptUsage, exp.tokens))
			case st.PromptUsage > exp.hi:
				s.Over++
				short.add("over", fmt.Sprintf("request %d: usage says %d prompt tokens, %d were sent", i+1, st.PromptUsage, exp.tokens))
			}
		case exp.counted:
			s.PromptTokens += exp.tokens
			s.FromTokenizer++
		default:
			s.NoUsage++
			short.add("no usage", fmt.Sprintf("request %d: the engine reported no prompt usage", i+1))
		}
	}
	if s.PromptTokens > 0 && end.After(start) {
		s.Wall = end.Sub(start)
		s.TPS = float64(s.PromptTokens) / s.Wall.Seconds()
	}
	s.Errors, s.Shortfalls = errs.lines(), short.lines()
	return s
}

// prefillBurst sends one prefill burst and summarizes it.
func (p *prober) prefillBurst(ctx context.Context, phase, url string, bodies [][]byte, expects []promptExpect) (prefillSummary, error) {
	start := time.Now()
	results, timedOut, err := p.send(ctx, phase, url, bodies, func(c *counters) int { return int(c.prompt.Load()) }, nil)
	if err != nil {
		return prefillSummary{}, err
	}
	s := summarizePrefill(results, expects)
	if timedOut {
		s.Errors = append([]string{fmt.Sprintf("the burst did not finish within %v", p.cfg.BurstTimeout)}, s.Errors...)
	}
	n := len(bodies)
	p.report(Progress{Phase: phase, Done: n, Total: n, Tokens: s.PromptTokens, TPS: s.TPS, Elapsed: time.Since(start)})
	return s, nil
}

// prefillVerdict records the measured prefill burst in pf and judges it:
// a prefill throughput only for a burst in which every prompt was read as
// sent, by the engine's own count.
func (p *prober) prefillVerdict(m *wire.Measurement, pf *wire.Prefill, s prefillSummary) {
	pf.PromptTokens, pf.ExpectedPromptTokens = s.PromptTokens, s.Expected
	pf.WallSeconds = s.Wall.Seconds()
	pf.TTFTP50, pf.TTFTP95 = percentile(s.TTFT, 0.5), percentile(s.TTFT, 0.95)
	pf.CachedTokens = s.Cached
	pf.TokenSource = TokensFromUsage
	if s.FromTokenizer > 0 {
		pf.TokenSource = TokensFromTokenizer
	}
	pf.Problems = append(pf.Problems, s.Errors...)
	pf.Problems = append(pf.Problems, s.Shortfalls...)
	raw := fmt.Sprintf("raw %.1f tok/s over %d prompt tokens not used", s.TPS, s.PromptTokens)
	length := pf.PromptLength
	switch {
	case s.Rejected > 0:
		failPrefill(pf, wire.PrefillRejected, fmt.Sprintf("the engine refused %d of %d prompts of %d tokens: %s", s.Rejected, s.Requests, length, s.Rejection))
	case s.Failed > 0:
		failPrefill(pf, wire.CodeProbeFailed, fmt.Sprintf("%d of %d measured prefill requests failed; %s", s.Failed, s.Requests, raw))
	case s.Truncated > 0:
		failPrefill(pf, wire.PrefillTruncated, fmt.Sprintf("the engine read fewer prompt tokens than were sent in %d of %d requests: it cut the prompts; %s",
			s.Truncated, s.Requests, raw))
	case s.Over > 0:
		failPrefill(pf, wire.PrefillUsageMismatch, fmt.Sprintf("usage counts more prompt tokens than were sent in %d of %d requests; %s",
			s.Over, s.Requests, raw))
	case s.PromptTokens > 0 && float64(s.Cached) > cachedShare*float64(s.PromptTokens):
		failPrefill(pf, wire.PrefillCached, fmt.Sprintf("the engine says its cache served %d of %d prompt tokens, although every prompt began with a unique random prefix; %s",
			s.Cached, s.PromptTokens, raw))
	case length >= cachedTTFTMin && m.DecodeTPSP50 > 0 && len(s.TTFT) > 0 && pf.TTFTP50 < cachedSteps/m.DecodeTPSP50:
		failPrefill(pf, wire.PrefillCached, fmt.Sprintf("the first token of a unique %d-token prompt came back in %.3f s (median), within %d of the engine's decode steps (%.3f s each): "+
			"the engine cannot have read the prompt, it answered as if from a cache; %s", length, pf.TTFTP50, cachedSteps, 1/m.DecodeTPSP50, raw))
	case s.NoUsage > 0:
		failPrefill(pf, wire.CodeProbeIncompleteOutput, fmt.Sprintf("the engine reported no prompt usage for %d of %d requests and has no tokenizer endpoint to count them; %s",
			s.NoUsage, s.Requests, raw))
	case s.PromptTokens == 0 || s.TPS <= 0:
		failPrefill(pf, wire.CodeProbeFailed, "the measured prefill burst read no prompt tokens")
	default:
		pf.ThroughputTPS = s.TPS
		pf.Complete = s.FromTokenizer == 0
		if s.FromTokenizer > 0 {
			pf.Problems = append(pf.Problems, fmt.Sprintf("the engine reported no prompt usage for %d of %d requests; their prompts were counted with its tokenizer before sending",
				s.FromTokenizer, s.Requests))
		}
	}
}

// failPrefill marks the prefill part as not valid, with why first.
func failPrefill(pf *wire.Prefill, code, why string) {
	pf.Failure = code
	pf.ThroughputTPS = 0
	pf.Complete = false
	pf.Problems = append([]string{why}, pf.Problems...)
}

// clipProblems bounds a problem list as wire accepts it.
func clipProblems(ps *[]string) {
	if len(*ps) > wire.MaxProblemCount {
		*ps = append((*ps)[:wire.MaxProblemCount-1], "more problems left out")
	}
	for i, p := range *ps {
		(*ps)[i] = wire.Clip(p, maxProblemBytes)
	}
}

// promptSet makes the prompts of one probe's prefill bursts: prompt i
// begins with a word no other prompt of the probe begins with, and every
// word after it is drawn at random, so no prefix cache (within the probe
// or from an earlier one) can serve more than a few tokens of it.
type promptSet struct {
	first int
	seeds []uint64
}

func newPromptSet(n int) promptSet {
	var b [8]byte
	_, _ = crand.Read(b[:])
	r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(b[:]), uint64(time.Now().UnixNano())))
	s := promptSet{first: r.IntN(len(promptWords)), seeds: make([]uint64, n)}
	for i := range s.seeds {
		s.seeds[i] = r.Uint64()
	}
	return s
}

// text is prompt i of words words.
func (s promptSet) text(i, words int) string {
	r := rand.New(rand.NewPCG(s.seeds[i], uint64(i)))
	var b strings.Builder
	b.Grow(words * 6)
	b.WriteString(promptWords[(s.first+i)%len(promptWords)])
	for range words - 1 {
		b.WriteByte(' ')
		b.WriteString(promptWords[r.IntN(len(promptWords))])
	}
	return b.String()
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
