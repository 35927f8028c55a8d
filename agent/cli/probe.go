package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/agent/probe"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/wire"
)

// probeArgs are the probe command's parsed flags.
type probeArgs struct {
	url, model, kind, prompt string
	concurrency, tokens      int
	json                     bool
	timeout                  time.Duration
	wait                     time.Duration // for the engine to be ready
	busyWait                 time.Duration // for a busy engine to be idle
	concurrencyGiven         bool
	// The prefill burst, after the decode burst.
	prefill                           bool
	prefillConcurrency, prefillTokens int
}

// runProbe warms an engine and measures it with the standard burst.
// Exit 0: a valid measurement; 1: the engine could not be measured; 2: bad flags.
func runProbe(args []string, stdio IO) int {
	return probeCmd(args, stdio, gpu.Open)
}

// probeCmd is runProbe with the GPU opener passed in (gpu.Open; tests
// pass their own).
func probeCmd(args []string, stdio IO, openGPUs func(hclog.Logger) (gpu.Source, error)) int {
	a, code, ok := parseProbe(args, stdio)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	m, err := a.run(ctx, stdio, openGPUs)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stdio.Err, "heft-agent probe: interrupted; no measurement")
			return 1
		}
		if errors.Is(err, probe.ErrBusy) {
			fmt.Fprintf(stdio.Err, "heft-agent probe: %s not measured: %v\n", a.url, err)
			return 1
		}
		fmt.Fprintf(stdio.Err, "heft-agent probe: %v\n", err)
		return 2
	}
	return a.render(stdio, m)
}

// parseProbe reads the probe command's flags; ok is false, with the exit
// code, when the command should stop (help, or bad flags).
func parseProbe(args []string, stdio IO) (a probeArgs, code int, ok bool) {
	fs := flag.NewFlagSet("heft-agent probe", flag.ContinueOnError)
	fs.StringVar(&a.url, "url", "", "engine base URL, e.g. http://127.0.0.1:8000 (required)")
	fs.StringVar(&a.model, "model", "", "model to request (default: the first one in /v1/models)")
	fs.StringVar(&a.kind, "engine", "", "engine kind: "+strings.Join(wire.EngineKinds, "|")+" (default: send every length field)")
	fs.IntVar(&a.concurrency, "concurrency", probe.DefaultConcurrency, "concurrent requests per burst")
	fs.IntVar(&a.tokens, "tokens", probe.DefaultTokens, "output tokens per request")
	fs.StringVar(&a.prompt, "prompt", probe.DefaultPrompt, "the prompt every request sends")
	fs.BoolVar(&a.prefill, "prefill", false, "also send the prefill burst: long prompts with one output token, twice")
	fs.IntVar(&a.prefillConcurrency, "prefill-concurrency", probe.DefaultPrefillConcurrency, "concurrent requests per prefill burst")
	fs.IntVar(&a.prefillTokens, "prefill-tokens", probe.DefaultPrefillTokens, "prompt tokens per prefill request (fewer where the engine cannot hold them)")
	fs.BoolVar(&a.json, "json", false, "print the measurement as JSON")
	fs.DurationVar(&a.timeout, "timeout", probe.DefaultBurstTimeout, "how long each burst may take (and the wait for the engine, unless --wait)")
	fs.DurationVar(&a.wait, "wait", probe.DefaultBurstTimeout, "how long to wait for the engine to be ready (default: --timeout); the wait is shown every few seconds")
	fs.DurationVar(&a.busyWait, "busy-wait", probe.DefaultBusyWait, "how long to wait for a busy engine to be idle; a burst shared with other traffic is never a measurement")
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "usage: heft-agent probe --url URL [--model M] [--engine KIND] [--concurrency 16] [--tokens 128] [--prompt P]")
		fmt.Fprintln(w, "                         [--prefill [--prefill-concurrency 4] [--prefill-tokens 8192]] [--json] [--timeout D] [--wait D] [--busy-wait D]")
		fmt.Fprintln(w, "\nSends the standard burst twice, keeps the second, and prints what the engine carries.")
		fmt.Fprintln(w, "It waits for a busy engine to be idle, and sends 16 requests per data-parallel rank unless --concurrency says otherwise.")
		fmt.Fprintln(w, "With --prefill it then sends the prefill burst twice too, and prints how fast the engine reads prompts.")
		fmt.Fprintln(w)
		settings.PrintFlags(w, fs)
	}
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return a, code, false
	}
	if !flagGiven(fs, "wait") {
		a.wait = a.timeout // as before --wait: one limit for both
	}
	a.concurrencyGiven = flagGiven(fs, "concurrency")
	var problem string
	switch {
	case a.url == "":
		problem = "--url is required, e.g. --url http://127.0.0.1:8000"
	case !httpURL(a.url):
		problem = fmt.Sprintf("--url %q is not an http(s) URL, e.g. http://127.0.0.1:8000", a.url)
	case a.kind != "" && !engine.Known(a.kind):
		problem = fmt.Sprintf("--engine %q is not one of %s", a.kind, strings.Join(wire.EngineKinds, ", "))
	case a.concurrency < 1 || a.concurrency > probe.MaxConcurrency:
		problem = fmt.Sprintf("--concurrency must be 1..%d, got %d", probe.MaxConcurrency, a.concurrency)
	case a.tokens < 1 || a.tokens > probe.MaxTokens:
		problem = fmt.Sprintf("--tokens must be 1..%d, got %d", probe.MaxTokens, a.tokens)
	case a.timeout <= 0:
		problem = fmt.Sprintf("--timeout must be positive, got %v", a.timeout)
	case a.wait <= 0:
		problem = fmt.Sprintf("--wait must be positive, got %v", a.wait)
	case a.busyWait < 0:
		problem = fmt.Sprintf("--busy-wait must not be negative, got %v", a.busyWait)
	case a.prefillConcurrency < 1 || a.prefillConcurrency > probe.MaxPrefillConcurrency:
		problem = fmt.Sprintf("--prefill-concurrency must be 1..%d, got %d", probe.MaxPrefillConcurrency, a.prefillConcurrency)
	case a.prefillTokens < probe.MinPrefillTokens || a.prefillTokens > probe.MaxPrefillTokens:
		problem = fmt.Sprintf("--prefill-tokens must be %d..%d, got %d", probe.MinPrefillTokens, probe.MaxPrefillTokens, a.prefillTokens)
	default:
		return a, 0, true
	}
	fmt.Fprintf(stdio.Err, "heft-agent probe: %s\n", problem)
	usage(stdio.Err) // a usage error: the problem, then the usage (cli.md)
	return a, 2, false
}

func httpURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// run measures the engine, showing progress where a person is looking:
// stdout normally, stderr under --json (whose stdout is for scripts), and
// live only on a terminal.
func (a probeArgs) run(ctx context.Context, stdio IO, openGPUs func(hclog.Logger) (gpu.Source, error)) (wire.Measurement, error) {
	view := &probeView{w: stdio.Out, live: logging.IsTerminal(stdio.Out), url: a.url}
	if a.json {
		view = &probeView{w: stdio.Err, live: logging.IsTerminal(stdio.Err), quiet: !logging.IsTerminal(stdio.Err)}
	}
	cfg := probe.Config{
		URL: a.url, Kind: a.kind, Model: a.model,
		Concurrency: a.concurrency, Tokens: a.tokens, Prompt: a.prompt,
		CapacityKey: "cli:" + a.url, Trigger: "cli",
		Busy: probe.BusyWait, BusyWait: a.busyWait,
		ReadyTimeout: a.wait, BurstTimeout: a.timeout,
		Progress: view.update, OnWaiting: view.notice,
		Prefill: a.prefill, PrefillConcurrency: a.prefillConcurrency, PrefillTokens: a.prefillTokens,
	}
	var gpus []wire.GPU
	if src := probeLocalGPUs(a.url, openGPUs); src != nil {
		defer src.Close()
		cfg.GPUs = src.Devices
		gpus, _ = src.Devices(ctx)
	}
	unread := ""
	if c, err := a.engine(ctx); err != nil {
		unread = fmt.Sprintf("engine not read (%v): not checked for other traffic, and measured with %d requests whatever its data-parallel ranks", err, cfg.Concurrency)
	} else {
		// As the agent probes it: idle first, the burst watched for other
		// traffic, every data-parallel rank at the same load.
		e := c.Facts(ctx, gpus, nil)
		cfg.Load, cfg.EngineTree, cfg.GPUUUIDs = c.Load, c.Tree, e.GPUUUIDs
		cfg.Counters = c.Counters
		cfg.Stir = c.Stir
		cfg.Ranks = e.DataParallelRanks()
		if !a.concurrencyGiven {
			cfg.Concurrency = min(probe.DefaultConcurrency*cfg.Ranks, probe.MaxConcurrency)
		}
		if a.prefill {
			cfg.MaxContextTokens = e.MaxContextTokens()
		}
	}
	m, err := probe.Run(ctx, cfg)
	view.finish()
	if unread != "" {
		m.Problems = append(m.Problems, unread)
	}
	return m, err
}

// engine is a client for the engine at --url, of --engine's kind or the
// one it answers as.
func (a probeArgs) engine(ctx context.Context) (*engine.Client, error) {
	kind := a.kind
	if kind == "" {
		k, err := engine.Detect(ctx, a.url, engine.DefaultTimeout)
		if err != nil {
			return nil, err
		}
		kind = k
	}
	return engine.New(engine.Config{Kind: kind, URL: a.url}, nil)
}

// render prints the measurement, and why the engine could not be
// measured, and returns the exit code.
func (a probeArgs) render(stdio IO, m wire.Measurement) int {
	if a.json {
		enc := json.NewEncoder(stdio.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(m); err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent probe: %v\n", err)
			return 1
		}
	} else {
		printProbeMeasurement(stdio.Out, m)
	}
	if m.Valid() && (!a.prefill || m.PrefillValid()) {
		return 0
	}
	if m.Valid() {
		fmt.Fprintf(stdio.Err, "heft-agent probe: %s: decode measured, prefill not", m.EngineURL)
		if p := m.Prefill; p != nil {
			fmt.Fprintf(stdio.Err, " (%s)", probeOrUnknown(p.Failure))
			if len(p.Problems) > 0 {
				fmt.Fprintf(stdio.Err, ": %s", p.Problems[0])
			}
		}
		fmt.Fprintln(stdio.Err)
		return 1
	}
	fmt.Fprintf(stdio.Err, "heft-agent probe: %s could not be measured (%s)", m.EngineURL, probeOrUnknown(m.Failure))
	if len(m.Problems) > 0 {
		fmt.Fprintf(stdio.Err, ": %s", m.Problems[0])
	}
	fmt.Fprintln(stdio.Err)
	for _, p := range m.Problems[min(1, len(m.Problems)):] {
		fmt.Fprintf(stdio.Err, "  - %s\n", p)
	}
	return 1
}

func probeOrUnknown(s string) string {
	if s == "" {
		return "no throughput"
	}
	return s
}

// probeLocalGPUs opens this host's GPUs when the engine runs on this host, so
// the probe can record the clocks during the measured burst. It returns
// nil when GPUs cannot be read or the engine is elsewhere.
func probeLocalGPUs(engineURL string, openGPUs func(hclog.Logger) (gpu.Source, error)) gpu.Source {
	u, err := url.Parse(engineURL)
	if err != nil {
		return nil
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil
	}
	src, err := openGPUs(hclog.NewNullLogger())
	if err != nil {
		src.Close() // Open always returns a Source
		return nil
	}
	return src
}

// probeView shows a probe's progress: one line redrawn in place on a
// terminal, a plain line per phase otherwise.
type probeView struct {
	w     io.Writer
	live  bool
	quiet bool
	url   string

	phase string
	last  probe.Progress
	drawn int // width of the live line on screen
}

var probePhaseLabel = map[string]string{
	probe.PhaseWaitingReady:   "waiting",
	probe.PhaseWarmup:         "warm-up",
	probe.PhaseMeasure:        "measuring",
	probe.PhasePrefillWarmup:  "prefill warm-up",
	probe.PhasePrefillMeasure: "prefill",
	probe.PhaseDone:           "done",
}

func (v *probeView) update(p probe.Progress) {
	if v.quiet {
		return
	}
	changed := p.Phase != v.phase
	prev := v.phase
	v.phase = p.Phase
	if v.live {
		if changed && probeIsBurst(prev) {
			v.draw(v.last)
			fmt.Fprintln(v.w)
			v.drawn = 0
		}
		if p.Phase != probe.PhaseDone {
			v.draw(p)
		}
		v.last = p
		return
	}
	if changed {
		if probeIsBurst(prev) {
			fmt.Fprintf(v.w, "%s done: %d/%d requests, %d %s in %.2f s, %.1f tok/s\n",
				probePhaseLabel[prev], v.last.Done, v.last.Total, v.last.Tokens, probeTokenWord(prev), v.last.Elapsed.Seconds(), v.last.TPS)
		}
		switch p.Phase {
		case probe.PhaseWaitingReady:
			fmt.Fprintf(v.w, "waiting for %s to be ready\n", v.url)
		case probe.PhaseWarmup:
			fmt.Fprintf(v.w, "warm-up burst: %d requests\n", p.Total)
		case probe.PhaseMeasure:
			fmt.Fprintf(v.w, "measured burst: %d requests\n", p.Total)
		case probe.PhasePrefillWarmup:
			fmt.Fprintf(v.w, "prefill warm-up burst: %d long prompts\n", p.Total)
		case probe.PhasePrefillMeasure:
			fmt.Fprintf(v.w, "measured prefill burst: %d long prompts\n", p.Total)
		}
	}
	v.last = p
}

// notice says that the engine is not ready or not idle yet, on a line of its own:
// even under --json off a terminal (on stderr), since a probe that waits
// in silence looks hung. The live view shows it in its line instead.
func (v *probeView) notice(w probe.Waiting) {
	if !v.live {
		fmt.Fprintln(v.w, w)
	}
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

func probeIsBurst(phase string) bool {
	switch phase {
	case probe.PhaseWarmup, probe.PhaseMeasure, probe.PhasePrefillWarmup, probe.PhasePrefillMeasure:
		return true
	}
	return false
}

// probeTokenWord is what a burst's tokens are: output tokens of a decode
// burst, prompt tokens read of a prefill burst.
func probeTokenWord(phase string) string {
	if phase == probe.PhasePrefillWarmup || phase == probe.PhasePrefillMeasure {
		return "prompt tokens"
	}
	return "tokens"
}

func (v *probeView) draw(p probe.Progress) {
	var line string
	switch {
	case p.Phase == probe.PhaseWaitingReady && p.Waiting != nil:
		state := "not ready"
		if p.Waiting.Busy {
			state = "busy"
		}
		line = fmt.Sprintf("%-9s engine %s (%s)  %5.1f s, up to %s more", probePhaseLabel[p.Phase], state,
			wire.Clip(p.Waiting.Reason, 60), p.Elapsed.Seconds(), p.Waiting.Left.Round(time.Second))
	case p.Phase == probe.PhaseWaitingReady:
		line = fmt.Sprintf("%-9s for the engine to be ready  %5.1f s", probePhaseLabel[p.Phase], p.Elapsed.Seconds())
	default:
		line = fmt.Sprintf("%-9s %3d/%d requests  %6d %s  %8.1f tok/s  %5.1f s",
			probePhaseLabel[p.Phase], p.Done, p.Total, p.Tokens, probeTokenWord(p.Phase), p.TPS, p.Elapsed.Seconds())
	}
	pad := max(0, v.drawn-len(line))
	fmt.Fprintf(v.w, "\r%s%s", line, strings.Repeat(" ", pad))
	v.drawn = len(line)
}

// finish leaves the terminal on a fresh line.
func (v *probeView) finish() {
	if v.live && v.drawn > 0 {
		fmt.Fprintf(v.w, "\r%s\r", strings.Repeat(" ", v.drawn))
		v.drawn = 0
	}
}

// printProbeMeasurement writes the human summary of a measurement.
func printProbeMeasurement(w io.Writer, m wire.Measurement) {
	kind := m.EngineKind
	if kind == "" {
		kind = "engine kind not given"
	}
	fmt.Fprintf(w, "engine       %s (%s, model %s)\n", m.EngineURL, kind, probeOrDash(m.Model))
	switch {
	case m.Valid():
		fmt.Fprintf(w, "throughput   %.1f tok/s  (%d tokens in %.3f s; %d requests x %d tokens)\n",
			m.ThroughputTPS, m.OutputTokens, m.WallSeconds, m.Requests, m.TokensPerReq)
	default:
		fmt.Fprintf(w, "throughput   not measured: %s\n", probeOrUnknown(m.Failure))
	}
	if m.WarmupTPS > 0 {
		fmt.Fprintf(w, "warm-up      %.1f tok/s", m.WarmupTPS)
		if m.Valid() {
			fmt.Fprintf(w, "  (measured / warm-up = %.2f; well above 1 means the engine was cold)", m.ThroughputTPS/m.WarmupTPS)
		}
		fmt.Fprintln(w)
	}
	if m.OutputTokens > 0 {
		fmt.Fprintf(w, "tokens       %d of %d expected", m.OutputTokens, m.ExpectedTokens)
		if !m.Complete {
			fmt.Fprint(w, " (incomplete)")
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "decode       p50 %.1f tok/s, p95 %.1f tok/s per request\n", m.DecodeTPSP50, m.DecodeTPSP95)
		fmt.Fprintf(w, "first token  p50 %.3f s, p95 %.3f s\n", m.TTFTP50, m.TTFTP95)
	}
	if m.SMClockMedianMHz > 0 {
		fmt.Fprintf(w, "sm clock     min %.0f, median %.0f, max %.0f MHz", m.SMClockMinMHz, m.SMClockMedianMHz, m.SMClockMaxMHz)
		if len(m.ClockEventReasons) > 0 {
			fmt.Fprintf(w, "; clock events: %s", strings.Join(m.ClockEventReasons, ", "))
		}
		fmt.Fprintln(w)
	}
	if m.Busy {
		fmt.Fprintf(w, "load before  %d running, %d waiting: the engine was busy\n", m.LoadBefore.Running, m.LoadBefore.Waiting)
	}
	printProbePrefill(w, m)
	fmt.Fprintf(w, "when         %s, %.1f s in all\n", m.StartedAt.Format(time.RFC3339), m.FinishedAt.Sub(m.StartedAt).Seconds())
	if m.Valid() {
		for _, p := range m.Problems {
			fmt.Fprintf(w, "note         %s\n", p)
		}
		if m.Prefill != nil {
			for _, p := range m.Prefill.Problems[min(len(m.Prefill.Problems), probeFirstIfFailed(m.Prefill)):] {
				fmt.Fprintf(w, "note         prefill: %s\n", p)
			}
		}
	}
}

// printProbePrefill writes the prefill burst's part of the summary.
func printProbePrefill(w io.Writer, m wire.Measurement) {
	p := m.Prefill
	if p == nil {
		return
	}
	switch {
	case m.PrefillValid():
		fmt.Fprintf(w, "prefill      %.1f tok/s  (%d prompt tokens in %.3f s; %d requests x %d tokens)\n",
			p.ThroughputTPS, p.PromptTokens, p.WallSeconds, p.Requests, p.PromptLength)
	case p.Failure != "":
		why := ""
		if len(p.Problems) > 0 {
			why = ": " + p.Problems[0]
		}
		fmt.Fprintf(w, "prefill      not measured: %s%s\n", p.Failure, why)
	}
	if p.WarmupTPS > 0 {
		fmt.Fprintf(w, "  warm-up    %.1f tok/s", p.WarmupTPS)
		if m.PrefillValid() {
			fmt.Fprintf(w, "  (measured / warm-up = %.2f)", p.ThroughputTPS/p.WarmupTPS)
		}
		fmt.Fprintln(w)
	}
	if p.PromptTokens > 0 {
		fmt.Fprintf(w, "  prompts    %d of %d tokens expected, counted by %s", p.PromptTokens, p.ExpectedPromptTokens, probeOrDash(p.TokenSource))
		if p.CachedTokens > 0 {
			fmt.Fprintf(w, "; %d served by the engine's cache", p.CachedTokens)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  first token p50 %.3f s, p95 %.3f s\n", p.TTFTP50, p.TTFTP95)
	}
	if m.Valid() && m.PrefillValid() {
		fmt.Fprintf(w, "  prefill / decode throughput = %.1f\n", p.ThroughputTPS/m.ThroughputTPS)
	}
}

// probeFirstIfFailed skips a failed prefill part's first problem, which
// its "not measured" line already shows.
func probeFirstIfFailed(p *wire.Prefill) int {
	if p.Failure != "" {
		return 1
	}
	return 0
}

func probeOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
