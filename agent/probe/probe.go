// Package probe measures what an inference engine can carry: it waits for
// the engine to be ready, sends the standard burst (16 concurrent streamed
// chat requests of exactly 128 output tokens) once to warm the engine and
// once more to measure it, and returns total tokens / wall time of the
// second burst as a wire.Measurement. With Config.Prefill it then sends the
// prefill burst the same way (prefill.go): a few long prompts with one
// output token, prompt tokens / wall time in Measurement.Prefill.
//
// A probe costs two bursts (four with the prefill burst) and nothing more.
// A burst that comes back short, with errors, or with usage and stream
// disagreeing is reported as a failure with its reasons, never as a
// throughput; a failed prefill burst leaves the decode measurement valid.
package probe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// Defaults of the standard burst (PRODUCT.md, story 2).
const (
	DefaultConcurrency  = 16
	DefaultTokens       = 128
	DefaultPrompt       = "Write a long story about a lighthouse keeper and the sea."
	DefaultReadyTimeout = 2 * time.Minute
	DefaultBurstTimeout = 5 * time.Minute
)

// Limits on a Config, so a typo cannot start a million streams.
const (
	MaxConcurrency = 1024
	MaxTokens      = 1 << 16
)

// Progress phases.
const (
	PhaseWaitingReady = "waiting_ready"
	PhaseWarmup       = "warmup"
	PhaseMeasure      = "measure"
	PhaseDone         = "done"
)

// ErrBusy is returned (errors.Is) by a probe that found the engine busy
// and did not measure it (see Config.Busy), or whose measured burst the
// engine's own counters show was shared with other traffic, or ran on an
// engine that restarted; the caller should try again later. Its Busy method says so to packages that do not
// import probe (the link).
var ErrBusy error = busyError{}

// Config says what to probe and how.
type Config struct {
	URL         string // engine base URL, e.g. http://127.0.0.1:8000
	Kind        string // wire.EngineVLLM etc.; "" sends every length field and expects an exact length
	Model       string // "" = the first model from /v1/models
	Concurrency int    // default 16; the whole burst, every rank's share together
	// Ranks is how many data-parallel ranks Concurrency is spread over
	// (recorded in Measurement.Ranks); 0 = not said.
	Ranks       int
	Tokens      int    // per request; default 128
	Prompt      string // default DefaultPrompt
	CapacityKey string
	Node        string
	Trigger     string // wire.ReasonScheduled etc., or "cli"
	// Busy is what the probe does when Load reports requests running or
	// waiting (the agent's probe_busy): BusyWait (the default) waits up to
	// BusyWait for the engine to be idle, BusyDrain calls Drain first,
	// BusyPassiveOnly returns ErrBusy at once. Idle means idle for
	// IdleSettle (2 s): an engine read idle is watched that long first.
	// A busy engine is never measured: a probe still busy at the end of
	// the wait returns ErrBusy.
	// An engine whose load cannot be read is probed, with a note in
	// Problems, so engines without metrics are still measured.
	Busy string
	// BusyWait bounds the wait for an idle engine; default DefaultBusyWait.
	BusyWait time.Duration
	// RequireIdle (scheduled probes) makes BusyWait return ErrBusy at
	// once rather than wait: the coordinator asks again later.
	RequireIdle bool
	// IdleOnly (wire.ProbeRequest.IdleOnly) returns ErrBusy at once for a
	// busy engine whatever Busy says: no wait, no drain.
	IdleOnly bool
	// Drain, optional, asks the gateways to stop sending the engine
	// requests (BusyDrain); the requests in flight finish while the probe
	// waits. Whoever drains restores the worker when the probe ends.
	Drain func(ctx context.Context) error
	// Counters, optional, reads the engine's generated-tokens counter
	// (engine.Client.Counters) while an idle engine settles, before,
	// during (every watchPoll) and after each burst: a counter that grew by
	// more than the burst received means other traffic shared the engine
	// (mid-burst, only where Load also shows more requests than the
	// burst's), and Run returns ErrBusy, not a number. Where it cannot be
	// read, Load alone watches each burst (loadWatch). Only Generated and
	// Ranks are used: a burst is judged only by two reads summed over the
	// same ranks (checkBurst).
	Counters func(ctx context.Context) (engine.Counters, error)
	// Stir, optional, reads what moves at every step of an engine with
	// requests running (engine.Client.Stir): a load that reads busy while
	// it and this stand still for StaleLoadAfter is a load the engine
	// stopped updating, and the probe takes the engine for idle.
	Stir       func(ctx context.Context) (float64, error)
	staleAfter time.Duration // StaleLoadAfter; tests shorten it
	busyPoll   time.Duration // how often a waiting probe reads the load; tests shorten it
	settle     time.Duration // how long an idle engine must stay idle; tests shorten it
	watchPoll  time.Duration // how often a burst reads the engine's counter; tests shorten it
	// Load, optional, reads the engine's load just before the probe.
	Load func(ctx context.Context) (wire.Load, error)
	// GPUs, optional, is sampled every 200ms during the measured burst.
	GPUs     func(ctx context.Context) ([]wire.GPU, error)
	GPUUUIDs []string // the engine's GPUs; empty = all
	// EngineTree lists the engine's processes on this host (nil: not
	// known). It is read as the measured burst starts, after the warm-up
	// loaded whatever the engine loads on demand; what those processes
	// hold on each GPU through the burst is Measurement.GPUMemory.
	EngineTree func(ctx context.Context) []int
	// ReadyTimeout bounds the wait for /health and /v1/models; default 2m.
	ReadyTimeout time.Duration
	// BurstTimeout bounds each burst; default 5m. A stuck engine ends the
	// probe with probe_failed.
	BurstTimeout time.Duration
	// Progress, optional, is called from one goroutine at a time, about
	// ten times a second during a burst and at every phase change.
	Progress func(Progress)
	// OnWaiting, optional, hears that the engine is not ready yet: at the
	// first failed check, when the reason changes, and every
	// WaitNoticeEvery while the wait lasts, from Run's goroutine.
	OnWaiting  func(Waiting)
	HTTPClient *http.Client // default: a client with enough idle connections for the burst

	// Prefill sends the prefill burst (prefill.go) after a valid decode
	// burst, into Measurement.Prefill.
	Prefill bool
	// PrefillConcurrency is the requests of a prefill burst; default 4.
	PrefillConcurrency int
	// PrefillTokens is the tokens of each prompt; default 8192.
	PrefillTokens int
	// MaxContextTokens is the longest sequence the worker can hold
	// (wire.Engine.MaxContextTokens); prompts stay TemplateMargin below it.
	// 0 = unknown.
	MaxContextTokens int64
}

// Progress is a live view of a running probe.
type Progress struct {
	Phase   string // PhaseWaitingReady, PhaseWarmup, PhaseMeasure or PhaseDone
	Done    int    // requests finished in this burst
	Total   int    // requests in this burst
	Tokens  int    // tokens streamed so far in this burst
	TPS     float64
	Elapsed time.Duration // since the phase began
	// Waiting says why the engine is not ready, in PhaseWaitingReady
	// after a check failed; nil otherwise.
	Waiting *Waiting
}

func (c *Config) normalize() error {
	u, err := url.Parse(strings.TrimSpace(c.URL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("probe: engine URL %q is not an http(s) URL", c.URL)
	}
	// Accept an OpenAI base URL too: health and models live at the root.
	c.URL = strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), "/v1")
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Tokens == 0 {
		c.Tokens = DefaultTokens
	}
	if c.Prompt == "" {
		c.Prompt = DefaultPrompt
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("probe: concurrency %d is outside 1..%d", c.Concurrency, MaxConcurrency)
	}
	if c.Tokens < 1 || c.Tokens > MaxTokens {
		return fmt.Errorf("probe: tokens %d is outside 1..%d", c.Tokens, MaxTokens)
	}
	if len(c.Prompt) > wire.MaxStringBytes {
		return fmt.Errorf("probe: prompt is %d bytes, at most %d", len(c.Prompt), wire.MaxStringBytes)
	}
	switch c.Busy {
	case "":
		c.Busy = BusyWait
	case BusyWait, BusyDrain, BusyPassiveOnly:
	default:
		return fmt.Errorf("probe: busy %q is not one of %s", c.Busy, strings.Join(BusyModes, ", "))
	}
	if c.BusyWait < 0 || c.Ranks < 0 || c.Ranks > wire.MaxRanks {
		return errors.New("probe: negative busy wait or ranks out of range")
	}
	if c.BusyWait == 0 {
		c.BusyWait = DefaultBusyWait
	}
	if c.ReadyTimeout < 0 || c.BurstTimeout < 0 {
		return errors.New("probe: negative timeout")
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.BurstTimeout == 0 {
		c.BurstTimeout = DefaultBurstTimeout
	}
	if c.Prefill {
		return c.normalizePrefill()
	}
	return nil
}

// Run probes one engine. It returns a Measurement whose Failure names what
// went wrong (engine_unreachable, probe_failed, probe_incomplete_output)
// whenever the engine misbehaved; it returns an error only for an invalid
// Config, ErrBusy, or ctx ending.
//
// For a kind that can be told an exact length, a measured burst with any
// short, long or unaccounted request has Failure probe_incomplete_output
// and ThroughputTPS 0: the raw number is in Problems, so nothing can use it
// as a weight by mistake. mlx-lm and Ollama cannot be told a length: their
// measurement is valid but Complete is false, and its throughput counts the
// tokens that came back.
func Run(ctx context.Context, cfg Config) (wire.Measurement, error) {
	if err := cfg.normalize(); err != nil {
		return wire.Measurement{}, err
	}
	form, err := engine.OutputFor(cfg.Kind)
	if err != nil {
		return wire.Measurement{}, fmt.Errorf("probe: %w", err)
	}
	client := cfg.HTTPClient
	if client == nil {
		tr, ok := http.DefaultTransport.(*http.Transport)
		if ok {
			tr = tr.Clone()
		} else {
			tr = &http.Transport{}
		}
		// Keep every connection of the warm-up for the measured burst.
		tr.MaxIdleConnsPerHost = max(cfg.Concurrency, cfg.PrefillConcurrency)
		client = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	noFollow := *client
	noFollow.CheckRedirect = noRedirects
	client = &noFollow
	p := &prober{cfg: cfg, form: form, client: client}
	m := wire.Measurement{
		CapacityKey:    cfg.CapacityKey,
		Node:           cfg.Node,
		EngineKind:     cfg.Kind,
		EngineURL:      cfg.URL,
		Model:          cfg.Model,
		Concurrency:    cfg.Concurrency,
		Ranks:          cfg.Ranks,
		Requests:       cfg.Concurrency,
		TokensPerReq:   cfg.Tokens,
		ExpectedTokens: cfg.Concurrency * cfg.Tokens,
		Prompt:         cfg.Prompt,
		Trigger:        cfg.Trigger,
		StartedAt:      time.Now().UTC(),
	}
	err = p.run(ctx, &m)
	m.FinishedAt = time.Now().UTC()
	if err == nil {
		p.report(Progress{Phase: PhaseDone, Done: m.Requests, Total: m.Requests, Tokens: m.OutputTokens,
			TPS: m.ThroughputTPS, Elapsed: m.FinishedAt.Sub(m.StartedAt)})
	}
	if len(m.Problems) > wire.MaxProblemCount {
		m.Problems = append(m.Problems[:wire.MaxProblemCount-1], "more problems left out")
	}
	for i, p := range m.Problems {
		m.Problems[i] = wire.Clip(p, maxProblemBytes)
	}
	return m, err
}

// maxProblemBytes keeps each problem well inside wire.MaxStringBytes even
// when an error quotes a long URL.
const maxProblemBytes = 1024

type prober struct {
	cfg    Config
	form   engine.OutputForm // how the engine's kind is asked for an exact length
	client *http.Client
}

// run waits for the engine, checks that it is idle, sends the two bursts
// and judges the second.
func (p *prober) run(ctx context.Context, m *wire.Measurement) error {
	p.report(Progress{Phase: PhaseWaitingReady})
	waitStart := time.Now()
	model, err := waitReady(ctx, p.client, p.cfg.URL, p.cfg.Model, p.cfg.ReadyTimeout, p.waiting(waitStart))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fail(m, wire.CodeEngineUnreachable, err.Error())
	}
	m.Model = model
	if err := p.checkIdle(ctx, m); err != nil {
		return err
	}
	meas, measured, err := p.measure(ctx, m)
	if err != nil || !measured {
		return err
	}
	if err := p.verdict(m, meas); err != nil {
		return err
	}
	if p.cfg.Prefill && m.Valid() {
		return p.prefill(ctx, m)
	}
	return nil
}

// checkIdle reads the engine's load just before the probe. A busy engine
// is waited for, drained or left alone as Config.Busy says (busy.go), and
// so is one whose load cannot be read now (a /metrics that timed out,
// answered 500 or does not parse): that is no proof it is idle. Only an
// engine that serves no load at all is probed with a note.
func (p *prober) checkIdle(ctx context.Context, m *wire.Measurement) error {
	if p.cfg.Load == nil {
		return nil
	}
	load, err := p.readLoad(ctx)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && !engine.LoadNotServed(err):
		return p.onBusy(ctx, m, unreadLoad(err))
	case err != nil:
		m.Problems = append(m.Problems, fmt.Sprintf("engine load unknown: %v", err))
	case load.Validate() != nil:
		m.Problems = append(m.Problems, fmt.Sprintf("engine load unusable: %v", load.Validate()))
	case !load.Known:
		m.LoadBefore = load
		if p.cfg.RequireIdle || p.cfg.IdleOnly {
			m.Problems = append(m.Problems, "engine does not report its load; idle not verified")
		}
	default:
		m.LoadBefore = load
		if load.Running+load.Waiting > 0 {
			if stillFor, err := p.staleLoad(ctx, load); err != nil || stillFor > 0 {
				if stillFor > 0 {
					p.noteStale(m, load, stillFor)
				}
				return err
			}
			return p.onBusy(ctx, m, busyLoad(load))
		}
		// Idle at this instant is not idle: a gateway's next request
		// may be a moment away.
		stirred, err := p.settle(ctx)
		if err != nil || stirred == "" {
			return err
		}
		return p.onBusy(ctx, m, stirred)
	}
	return nil
}

// measure sends the warm-up burst and then, unless every warm-up request
// failed (measured false, m then holds the failure), the measured burst
// with the GPUs' clocks sampled through it.
func (p *prober) measure(ctx context.Context, m *wire.Measurement) (meas burstSummary, measured bool, err error) {
	body, err := requestBody(p.form, m.Model, p.cfg.Prompt, p.cfg.Tokens)
	if err != nil {
		return burstSummary{}, false, fmt.Errorf("probe: build request: %w", err)
	}
	chatURL := p.cfg.URL + "/v1/chat/completions"

	start, startCounted := p.readGenerated(ctx, m)
	warm, err := p.burst(ctx, PhaseWarmup, chatURL, body, p.watchFor(m, PhaseWarmup, start, startCounted))
	if err != nil {
		return burstSummary{}, false, err
	}
	if p.form.ContinuousUsage && warm.Failed == warm.Requests && warm.refused(continuousUsage) {
		// vLLM before 0.5.1 and early builds of its Rust front end refuse
		// the field: count the tokens received by chunk there.
		p.form.ContinuousUsage = false
		m.Problems = append(m.Problems, "the engine refused stream_options."+continuousUsage+
			": asked again without it, tokens received during a burst counted a chunk each")
		if body, err = requestBody(p.form, m.Model, p.cfg.Prompt, p.cfg.Tokens); err != nil {
			return burstSummary{}, false, fmt.Errorf("probe: build request: %w", err)
		}
		start, startCounted = p.readGenerated(ctx, m)
		if warm, err = p.burst(ctx, PhaseWarmup, chatURL, body, p.watchFor(m, PhaseWarmup, start, startCounted)); err != nil {
			return burstSummary{}, false, err
		}
	}
	before, counted := p.readGenerated(ctx, m)
	if startCounted && counted {
		// Traffic that shared the warm-up would share the measured burst
		// too: stop here, and spare the engine's users half the burst.
		if err := p.checkBurst(ctx, m, PhaseWarmup, warm, start, &before); err != nil {
			return burstSummary{}, false, err
		}
	}
	m.WarmupTPS = warm.TPS
	for _, line := range append(warm.Errors, warm.Shortfalls...) {
		m.Problems = append(m.Problems, "warm-up: "+line)
	}
	if warm.Failed == warm.Requests {
		// Nothing came back; a second burst would only wait as long again.
		return burstSummary{}, false, fail(m, wire.CodeProbeFailed, "every warm-up request failed; the measured burst was not sent")
	}

	var sampler *gpuSampler
	if p.cfg.GPUs != nil {
		var tree []int
		if p.cfg.EngineTree != nil {
			tree = p.cfg.EngineTree(ctx)
		}
		sampler = startGPUSampler(ctx, p.cfg.GPUs, p.cfg.GPUUUIDs, tree)
	}
	meas, err = p.burst(ctx, PhaseMeasure, chatURL, body, p.watchFor(m, PhaseMeasure, before, counted))
	if sampler != nil {
		p.recordClocks(m, sampler.stop())
	}
	if err != nil {
		return meas, false, err
	}
	if counted {
		if after, ok := p.readGenerated(ctx, m); ok {
			if err := p.checkBurst(ctx, m, PhaseMeasure, meas, before, &after); err != nil {
				return meas, false, err
			}
		}
	}
	return meas, true, nil
}

// recordClocks puts what the GPU clocks did during the measured burst in
// m, and what the engine held on each GPU.
func (p *prober) recordClocks(m *wire.Measurement, g gpuSummary) {
	m.SMClockMinMHz, m.SMClockMedianMHz, m.SMClockMaxMHz = g.MinMHz, g.MedianMHz, g.MaxMHz
	m.ClockEventReasons = g.Reasons
	m.GPUMemory = g.Memory
	if len(m.ClockEventReasons) > 32 {
		m.ClockEventReasons = m.ClockEventReasons[:32]
	}
	if g.Samples == 0 && g.Err != nil {
		m.Problems = append(m.Problems, fmt.Sprintf("gpu clocks not sampled: %v", g.Err))
	}
	if g.Samples == 0 && g.Idle > 0 {
		m.Problems = append(m.Problems, "the GPUs sampled stayed idle through the measured burst: the engine may not run on them (no clock figures)")
	}
}

// verdict records the measured burst in m and judges it: a throughput
// only for a burst in which every request came back as asked.
func (p *prober) verdict(m *wire.Measurement, meas burstSummary) error {
	exact := p.form.Exact
	m.OutputTokens = meas.Tokens
	m.WallSeconds = meas.Wall.Seconds()
	m.DecodeTPSP50, m.DecodeTPSP95 = percentile(meas.Decode, 0.5), percentile(meas.Decode, 0.95)
	m.TTFTP50, m.TTFTP95 = percentile(meas.TTFT, 0.5), percentile(meas.TTFT, 0.95)
	m.Problems = append(m.Problems, meas.Errors...)
	m.Problems = append(m.Problems, meas.Shortfalls...)
	// An engine that cannot be told a length never ran the standard burst,
	// even when it happened to stop at the right count.
	m.Complete = !meas.Short && meas.Failed == 0 && exact

	switch {
	case meas.Failed > 0:
		return fail(m, wire.CodeProbeFailed, fmt.Sprintf("%d of %d measured requests failed; raw %.1f tok/s over %d tokens not used",
			meas.Failed, meas.Requests, meas.TPS, meas.Tokens))
	case meas.Short && exact:
		return fail(m, wire.CodeProbeIncompleteOutput, fmt.Sprintf("the engine did not return exactly %d tokens per request as asked; raw %.1f tok/s over %d of %d tokens not used",
			p.cfg.Tokens, meas.TPS, meas.Tokens, m.ExpectedTokens))
	case meas.Tokens == 0 || meas.TPS <= 0:
		return fail(m, wire.CodeProbeFailed, "the measured burst returned no tokens")
	case !exact:
		m.Problems = append(m.Problems, fmt.Sprintf("%s cannot be told an exact output length; throughput counts the %d of %d tokens that came back",
			p.cfg.Kind, meas.Tokens, m.ExpectedTokens))
	}
	m.ThroughputTPS = meas.TPS
	if f := meas.Fastest; f.TPS > MaxStreamTPS {
		// No engine streams this fast: what answered is not measuring an
		// engine's decoding (a cache, a replay, a fake). The coordinator
		// holds the worker until an admin admits it.
		m.Implausible = fmt.Sprintf("request %d delivered %d tokens %s after it was sent (the last %d within %s of the first): "+
			"%.0f tok/s for one stream; no engine streams faster than %d", f.Request, f.Tokens, f.Duration.Round(time.Microsecond),
			f.Tokens-1, f.Span.Round(time.Microsecond), f.TPS, MaxStreamTPS)
	}
	return nil
}

// MaxStreamTPS is the fastest one request's stream can plausibly deliver
// tokens, from its sending to its last token: far above any engine today
// (the fastest decode one request at a few thousand tokens a second).
const MaxStreamTPS = 5000

// noRedirects makes a client answer a redirect as it is: the probe
// measures the engine at the URL it was given, never wherever that engine
// points it (another host, perhaps not an engine at all).
func noRedirects(req *http.Request, via []*http.Request) error { return http.ErrUseLastResponse }

// fail marks m as not valid and keeps its throughput out of reach.
func fail(m *wire.Measurement, code, why string) error {
	m.Failure = code
	m.ThroughputTPS = 0
	m.Complete = false
	m.Problems = append([]string{why}, m.Problems...)
	return nil
}

// burstWatch is told, every watchPoll of a burst, the tokens received so
// far and the requests not yet finished; an error stops the burst.
type burstWatch func(ctx context.Context, received, unfinished int) error

// burst runs one decode burst: n copies of body, watched (watch, nil for
// none) for other traffic: every moment more slows its requests.
func (p *prober) burst(ctx context.Context, phase, url string, body []byte, watch burstWatch) (burstSummary, error) {
	bodies := make([][]byte, p.cfg.Concurrency)
	for i := range bodies {
		bodies[i] = body
	}
	start := time.Now()
	results, timedOut, err := p.send(ctx, phase, url, bodies, func(c *counters) int { return int(c.tokens.Load()) }, watch)
	if err != nil {
		return burstSummary{}, err
	}
	s := summarize(results, p.cfg.Tokens)
	if timedOut {
		s.Errors = append([]string{fmt.Sprintf("the burst did not finish within %v", p.cfg.BurstTimeout)}, s.Errors...)
	}
	n := len(bodies)
	p.report(Progress{Phase: phase, Done: n, Total: n, Tokens: s.Tokens, TPS: s.TPS, Elapsed: time.Since(start)})
	return s, nil
}

// send sends one request per body at once, bounded by BurstTimeout, and
// reports progress about ten times a second, counting tokens(c). Every
// watchPoll, watch (optional) is told the tokens received so far and the
// requests not yet finished; an error from it stops the burst, and send
// returns that error. Otherwise it returns an error only when ctx ends;
// timedOut says the burst's own bound cut it short.
func (p *prober) send(ctx context.Context, phase, url string, bodies [][]byte, tokens func(*counters) int,
	watch burstWatch) (results []reqResult, timedOut bool, err error) {
	n := len(bodies)
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	bctx, cancel := context.WithTimeout(wctx, p.cfg.BurstTimeout)
	defer cancel()
	var c counters
	start := time.Now()
	p.report(Progress{Phase: phase, Total: n})

	stopReporter := make(chan struct{})
	var wg sync.WaitGroup
	if watch != nil {
		wg.Go(func() {
			t := time.NewTicker(cmp.Or(p.cfg.watchPoll, watchPoll))
			defer t.Stop()
			for {
				select {
				case <-stopReporter:
					return
				case <-bctx.Done():
					return
				case <-t.C:
					if err := watch(bctx, tokens(&c), n-int(c.done.Load())); err != nil {
						stop(err)
						return
					}
				}
			}
		})
	}
	if p.cfg.Progress != nil {
		wg.Go(func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stopReporter:
					return
				case <-t.C:
					el := time.Since(start)
					tok := tokens(&c)
					p.report(Progress{Phase: phase, Done: int(c.done.Load()), Total: n, Tokens: tok,
						TPS: float64(tok) / el.Seconds(), Elapsed: el})
				}
			}
		})
	}
	results = runBurst(bctx, p.client, url, bodies, &c)
	close(stopReporter)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, false, ctx.Err()
	}
	if cause := context.Cause(wctx); cause != nil {
		return nil, false, cause
	}
	return results, bctx.Err() != nil, nil
}

func (p *prober) report(pr Progress) {
	if p.cfg.Progress != nil {
		p.cfg.Progress(pr)
	}
}
