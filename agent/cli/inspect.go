package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent"
	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/discover"
	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/agent/logsource"
	"heft/shared/health"
	"heft/shared/settings"
	"heft/shared/wire"
)

// inspectTarget is a default engine address inspect tries when no engine
// is named.
type inspectTarget struct {
	URL   string
	Kinds string // for messages: "vllm", "llamacpp/mlx"
}

// inspectDeps is what inspect reads of the world besides its flags and
// the engines: tests pass their own.
type inspectDeps struct {
	// targets are the engine addresses tried when none is named.
	targets func() []inspectTarget
	// openGPUs opens the GPU source (gpu.Open).
	openGPUs func(hclog.Logger) (gpu.Source, error)
	// keep limits --discover to the processes it accepts (tests); nil
	// keeps every one.
	keep func(pid int) bool
}

// hostInspectDeps are the real ones: the engines' default ports on this
// host, and its GPUs.
func hostInspectDeps() inspectDeps {
	return inspectDeps{
		targets: func() []inspectTarget {
			var out []inspectTarget
			for _, p := range engine.DefaultPorts() {
				out = append(out, inspectTarget{URL: fmt.Sprintf("http://127.0.0.1:%d", p.Port), Kinds: strings.Join(p.Kinds, "/")})
			}
			return out
		},
		openGPUs: gpu.Open,
	}
}

// inspectEngineFlags collects repeated --engine flags (config.EngineSyntax).
type inspectEngineFlags []engine.Config

func (f *inspectEngineFlags) String() string { return "" }

func (f *inspectEngineFlags) Set(v string) error {
	e, err := config.ParseEngine(v)
	if err != nil {
		return err
	}
	ec := engine.Config{Kind: strings.ToLower(e.Kind), URL: e.URL, Log: e.Log, Model: e.Model, AdvertiseURL: e.AdvertiseURL}
	if _, err := engine.New(ec, nil); err != nil {
		return err
	}
	if ec.Log != "" {
		if _, err := logsource.Parse(ec.Log); err != nil {
			return err
		}
	}
	*f = append(*f, ec)
	return nil
}

// inspectArgs are inspect's parsed flags.
type inspectArgs struct {
	json       bool
	configPath string
	node       string
	timeout    time.Duration
	engines    []engine.Config
	// log is the one engine's log source (--log), "" when not given.
	log string
	// discover finds the engines as run's discover = true does.
	discover bool
}

// inspectReport is inspect's JSON output.
type inspectReport struct {
	Host     wire.Host        `json:"host"`
	GPUs     []wire.GPU       `json:"gpus"`
	GPUError string           `json:"gpu_error"`
	Engines  []wire.Engine    `json:"engines"`
	Warnings []inspectWarning `json:"warnings"`
	// Logs say, for each engine with a log source, where it read from and
	// how: the file, unit or container, the wrapper, the lines read and
	// skipped and why, the last error.
	Logs []inspectLog `json:"logs"`
	// Notes say what inspect looked for and did not find.
	Notes []string `json:"notes"`

	node     string                      // the snapshot's node, for the text report
	findings map[string][]health.Finding // per engine URL, for the text report
	logs     map[string]logsource.Status // per engine URL, for the text report
}

// inspectLog is one engine's log source in the JSON report.
type inspectLog struct {
	Engine string `json:"engine"`
	logsource.Status
}

type inspectWarning struct {
	Engine   string `json:"engine"`
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// runInspect shows what the agent sees on this host. It exits 0 when it
// showed no CRITICAL warning, 2 when it did (an engine that cannot be
// read, pools far apart...), so scripts can act on it; 1 when it could not
// run (an unreadable config file); bad flags exit 2 too, with the usage on
// stderr and nothing on stdout.
func runInspect(args []string, stdio IO) int {
	return inspect(args, stdio, hostInspectDeps())
}

func inspect(args []string, stdio IO, deps inspectDeps) int {
	a, code, ok := parseInspect(args, stdio)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, code, err := a.run(ctx, stdio, deps)
	if err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent inspect: %v\n", err)
		return code
	}
	if a.json {
		enc := json.NewEncoder(stdio.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent inspect: %v\n", err)
			return 1
		}
		return rep.exitCode()
	}
	inspectPrint(stdio.Out, rep)
	return rep.exitCode()
}

// exitCode is 2 when the report shows a CRITICAL warning, else 0.
func (r inspectReport) exitCode() int {
	for _, w := range r.Warnings {
		if w.Severity == wire.SeverityCritical {
			return 2
		}
	}
	return 0
}

// parseInspect reads inspect's flags; ok is false, with the exit code,
// when inspect should stop (help, or bad flags: settings.ParseFlags).
func parseInspect(args []string, stdio IO) (a inspectArgs, code int, ok bool) {
	fs := flag.NewFlagSet("heft-agent inspect", flag.ContinueOnError)
	var ports []string
	for _, p := range engine.DefaultPorts() {
		ports = append(ports, fmt.Sprintf("%s %d", strings.Join(p.Kinds, "/"), p.Port))
	}
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "usage: heft-agent inspect [--json] [--config FILE] [--engine "+config.EngineSyntax+"]... [--log SOURCE]")
		fmt.Fprintln(w, "                          [--discover] [--node NAME] [--timeout 5s]")
		fmt.Fprintln(w, "\nShows this host's GPUs and engines: models, load, KV pools per data-parallel rank, launch")
		fmt.Fprintln(w, "arguments, capacity keys, foreign GPU processes and warnings. Without --engine or --config it")
		fmt.Fprintln(w, "looks for engines on their default ports on 127.0.0.1 ("+strings.Join(ports[:min(2, len(ports))], ", ")+",")
		fmt.Fprintln(w, strings.Join(ports[min(2, len(ports)):], ", ")+"). KIND is one of "+strings.Join(wire.EngineKinds, ", ")+".")
		fmt.Fprintln(w, "--discover finds them as run's discover = true does: the processes that launch one, the default")
		fmt.Fprintln(w, "ports, and the log each one's output goes to.")
		fmt.Fprintln(w, "SOURCE, the engine's start-up log, is "+logsource.Usage+".")
		fmt.Fprintln(w, "\nExit 0: no CRITICAL warning shown; 2: a CRITICAL warning shown (or bad flags); 1: could not run.")
		fmt.Fprintln(w)
		settings.PrintFlags(w, fs)
	}
	fs.BoolVar(&a.json, "json", false, "print JSON instead of text")
	fs.StringVar(&a.configPath, "config", "", "agent config `file`: its [node] name and [[engine]] entries")
	fs.StringVar(&a.node, "node", "", "node `name` used in capacity keys (default: the config's, else the host name)")
	fs.DurationVar(&a.timeout, "timeout", engine.DefaultTimeout, "limit for each request to an engine")
	var engines inspectEngineFlags
	fs.Var(&engines, "engine", "an engine to read, `"+config.EngineSyntax+"`; repeatable")
	fs.StringVar(&a.log, "log", "", "the start-up log (`SOURCE`) of the one engine inspected, as on pools")
	fs.BoolVar(&a.discover, "discover", false, "find the engines as run's discover = true does (processes, default ports, their logs), besides any named")
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return a, code, false
	}
	if a.timeout <= 0 {
		fmt.Fprintln(stdio.Err, "heft-agent inspect: --timeout must be positive")
		return a, 2, false
	}
	if a.log != "" {
		if _, err := logsource.Parse(a.log); err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent inspect: --log: %v\n", err)
			return a, 2, false
		}
	}
	a.engines = engines
	return a, 0, true
}

// run reads the engines (named, from the config, or found on the default
// ports) and the GPUs once, and judges each engine. An error comes with
// the exit code it deserves.
func (a inspectArgs) run(ctx context.Context, stdio IO, deps inspectDeps) (inspectReport, int, error) {
	logger := hclog.New(&hclog.LoggerOptions{Name: "inspect", Level: hclog.Warn, Output: stdio.Err})
	engines, nodeName := a.engines, a.node
	var logOpts logsource.Options
	if a.configPath != "" {
		// Neither coordinator nor token is needed to inspect, so the
		// config is not validated as a whole.
		cfg, err := config.Read(a.configPath, nil, os.Getenv)
		if err != nil {
			return inspectReport{}, 1, err
		}
		if nodeName == "" {
			nodeName = cfg.Node.Name
		}
		engines = inspectMerge(engines, agent.Engines(cfg))
		logOpts = agent.LogOptions(cfg)
	}
	var notes []string
	if a.discover {
		found, more, err := discover.Find(ctx, discover.Options{Timeout: a.timeout, PodsRoot: logOpts.PodsRoot, Keep: deps.keep})
		if err != nil {
			return inspectReport{}, 1, err
		}
		var fromDiscovery []engine.Config
		for _, f := range found {
			fromDiscovery = append(fromDiscovery, engine.Config{Kind: f.Kind, URL: f.URL, Log: f.Log})
		}
		engines = inspectMerge(engines, fromDiscovery)
		notes = append(notes, more...)
		if len(found) == 0 {
			notes = append(notes, "--discover found no engine: no process launches one and nothing answers on an engine's default port")
		}
	}
	if len(engines) == 0 && !a.discover {
		engines, notes = inspectDiscover(ctx, deps.targets(), a.timeout)
	}
	if a.log != "" {
		if len(engines) != 1 {
			return inspectReport{}, 2, fmt.Errorf("--log names the log of one engine, but %d are inspected: give each its own with --engine KIND=URL,log=SOURCE", len(engines))
		}
		engines[0].Log = a.log
	}
	for i := range engines {
		engines[i].Timeout = a.timeout
	}

	src, gpuErr := deps.openGPUs(logger)
	if src == nil {
		return inspectReport{}, 1, fmt.Errorf("no gpu source: %v", gpuErr)
	}
	defer src.Close()
	cfg := collect.Config{Node: nodeName, Engines: engines, LogOptions: logOpts}
	if gpuErr != nil {
		cfg.GPUError = gpuErr.Error()
	}
	col, err := collect.New(cfg, src, logger)
	if err != nil {
		return inspectReport{}, 2, err
	}
	if err := col.ReadLogsOnce(ctx); err != nil {
		notes = append(notes, err.Error())
	}
	snap := col.Snapshot(ctx)

	rep := inspectReport{Host: snap.Host, GPUs: snap.GPUs, GPUError: snap.GPUError, Engines: snap.Engines,
		Warnings: []inspectWarning{}, Logs: []inspectLog{}, Notes: notes, node: snap.Node, findings: map[string][]health.Finding{},
		logs: col.LogStatus()}
	for _, e := range snap.Engines {
		if st, ok := rep.logs[e.URL]; ok {
			rep.Logs = append(rep.Logs, inspectLog{Engine: e.URL, Status: st})
		}
	}
	if rep.Notes == nil {
		rep.Notes = []string{}
	}
	for _, e := range snap.Engines {
		fs := health.Engine(e, snap.GPUs, health.DefaultThresholds())
		health.Sort(fs)
		rep.findings[e.URL] = fs
		for _, f := range fs {
			rep.Warnings = append(rep.Warnings, inspectWarning{Engine: e.URL, Code: f.Code, Severity: f.Severity, Message: f.Message})
		}
	}
	return rep, 0, nil
}

// inspectMerge adds the config's engines to those named by flags; a flag
// wins over a config entry for the same engine, however its URL is spelled.
func inspectMerge(flags, fromConfig []engine.Config) []engine.Config {
	out := append([]engine.Config(nil), flags...)
	for _, c := range fromConfig {
		dup := false
		for _, f := range flags {
			if config.EngineID(f.URL) == config.EngineID(c.URL) {
				dup = true
			}
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// inspectDiscover looks for engines at the default addresses.
func inspectDiscover(ctx context.Context, targets []inspectTarget, timeout time.Duration) ([]engine.Config, []string) {
	var engines []engine.Config
	var notes, tried []string
	for _, t := range targets {
		tried = append(tried, fmt.Sprintf("%s %s", t.Kinds, strings.TrimPrefix(t.URL, "http://")))
		if !engine.PortOpen(ctx, t.URL, min(timeout, time.Second)) {
			continue
		}
		kind, err := engine.Detect(ctx, t.URL, timeout)
		if err != nil {
			notes = append(notes, fmt.Sprintf("something listens at %s but was not recognised: %v", t.URL, err))
			continue
		}
		engines = append(engines, engine.Config{Kind: kind, URL: t.URL})
	}
	if len(engines) == 0 {
		notes = append(notes, fmt.Sprintf("no engine found on the default ports (%s); pass --engine or --config", strings.Join(tried, ", ")))
	}
	return engines, notes
}

// inspectPrint writes the human report.
func inspectPrint(w io.Writer, rep inspectReport) {
	h := rep.Host
	hostLine := []string{h.Hostname, h.OS + "/" + h.Arch}
	if h.Platform != "" {
		hostLine = append(hostLine, strings.TrimSpace(h.Platform+" "+h.PlatformVersion))
	}
	if h.CPUModel != "" || h.CPUCores > 0 {
		hostLine = append(hostLine, strings.TrimSpace(fmt.Sprintf("%s, %d cores", h.CPUModel, h.CPUCores)))
	}
	if h.MemoryTotal > 0 {
		hostLine = append(hostLine, fmt.Sprintf("memory %s available of %s", inspectGiB(h.MemoryAvailable), inspectGiB(h.MemoryTotal)))
	}
	if h.UnifiedMemory {
		hostLine = append(hostLine, "unified memory")
	}
	fmt.Fprintf(w, "node  %s\nhost  %s\n\n", rep.node, strings.Join(hostLine, "  "))

	if len(rep.GPUs) == 0 {
		reason := rep.GPUError
		if reason == "" {
			reason = "none reported"
		}
		fmt.Fprintf(w, "no GPUs found (%s)\n", reason)
	} else {
		fmt.Fprintln(w, "GPUs")
		if rep.GPUError != "" {
			fmt.Fprintf(w, "  note: %s\n", rep.GPUError)
		}
		for _, g := range rep.GPUs {
			inspectPrintGPU(w, g)
		}
	}

	for _, e := range rep.Engines {
		fmt.Fprintln(w)
		inspectPrintEngine(w, e, rep.findings[e.URL], rep.logs)
	}
	if len(rep.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range rep.Notes {
			fmt.Fprintln(w, n)
		}
	}
}

func inspectPrintGPU(w io.Writer, g wire.GPU) {
	fmt.Fprintf(w, "  [%d] %s  %s\n", g.Index, inspectOr(g.Name, "unknown GPU"), g.UUID)
	if g.Error != "" {
		fmt.Fprintf(w, "      error: %s\n", g.Error)
	}
	if g.MemoryTotal > 0 {
		fmt.Fprintf(w, "      memory       %s free of %s\n", inspectGiB(g.MemoryFree), inspectGiB(g.MemoryTotal))
	}
	var parts []string
	if g.SMClockMHz > 0 || g.SMClockMaxMHz > 0 {
		parts = append(parts, fmt.Sprintf("SM clock %d / %d MHz", g.SMClockMHz, g.SMClockMaxMHz))
	}
	if g.TemperatureC > 0 {
		parts = append(parts, fmt.Sprintf("%.0f °C", g.TemperatureC))
	}
	if g.PowerDrawW > 0 || g.PowerLimitW > 0 {
		parts = append(parts, fmt.Sprintf("power %.0f / %.0f W", g.PowerDrawW, g.PowerLimitW))
	}
	if g.UtilizationPercent > 0 {
		parts = append(parts, fmt.Sprintf("busy %.0f%%", g.UtilizationPercent))
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "      %s\n", strings.Join(parts, "   "))
	}
	if len(g.ClockEventReasons) > 0 {
		fmt.Fprintf(w, "      throttle     %s\n", strings.Join(g.ClockEventReasons, ", "))
	}
	for i, p := range g.Processes {
		label := "      processes    "
		if i > 0 {
			label = "                   "
		}
		tag := ""
		if p.Foreign {
			tag = "  FOREIGN (not the engine's)"
		}
		fmt.Fprintf(w, "%spid %d %s %s%s\n", label, p.PID, inspectOr(p.Name, "?"), inspectGiB(p.UsedMemory), tag)
	}
}

func inspectPrintEngine(w io.Writer, e wire.Engine, findings []health.Finding, logs map[string]logsource.Status) {
	fmt.Fprintf(w, "engine %s at %s\n", e.Kind, e.URL)
	row := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-13s%s\n", label, fmt.Sprintf(format, args...))
	}
	more := func(format string, args ...any) {
		fmt.Fprintf(w, "  %-13s%s\n", "", fmt.Sprintf(format, args...))
	}
	if e.Error != "" {
		row("error", "%s", e.Error)
	}
	row("ready", "%s", map[bool]string{true: "yes", false: "no"}[e.Ready])
	model := inspectOr(e.Model, "unknown")
	if e.Version != "" {
		model += " (version " + e.Version + ")"
	}
	row("model", "%s", model)
	if len(e.Models) > 1 {
		more("serves %d models: %s", len(e.Models), strings.Join(e.Models[:min(len(e.Models), 8)], ", "))
	}
	if e.Load.Known {
		row("load", "%d running, %d waiting, KV %.0f%% on the busiest rank", e.Load.Running, e.Load.Waiting, 100*e.Load.KVUsage)
		if len(e.Load.Ranks) > 1 {
			for _, r := range e.Load.Ranks {
				more("rank %d: %d running, %d waiting, KV %.0f%%", r.DPRank, r.Running, r.Waiting, 100*r.KVUsage)
			}
		}
	} else {
		row("load", "not exposed by this engine")
	}
	inspectPrintPools(e, row, more)
	if st, ok := logs[e.URL]; ok {
		inspectPrintLog(st, row, more)
	} else if e.LogSource != nil && e.LogSource.Error != "" {
		row("log", "%s: %s", e.LogSource.Spec, e.LogSource.Error)
	}
	if len(e.LaunchArgs) > 0 {
		row("launch args", "%s", strings.Join(e.LaunchArgs, " "))
		more("(from %s)", e.LaunchArgsSource)
	} else {
		row("launch args", "unknown")
	}
	row("capacity key", "%s", inspectOr(e.CapacityKey, "none (model unknown)"))
	if e.MaxRunning > 0 {
		row("runs at once", "%d sequences (%s)", e.MaxRunning, e.MaxRunningSource)
	} else {
		row("runs at once", "unknown")
	}
	row("gateways use", "%s", inspectAdvertise(e))
	if e.PID > 0 {
		gpus := "no GPU memory seen"
		if len(e.GPUUUIDs) > 0 {
			gpus = "GPUs " + strings.Join(e.GPUUUIDs, ", ")
		}
		row("process", "pid %d, %s", e.PID, gpus)
	} else {
		row("process", "not found on this host")
	}
	for i, p := range e.ForeignProcesses {
		label := "foreign"
		if i > 0 {
			label = ""
		}
		row(label, "pid %d (%s) holds %s on its GPUs", p.PID, inspectOr(p.Name, "?"), inspectGiB(p.UsedMemory))
	}
	if len(findings) == 0 {
		row("warnings", "none")
		return
	}
	fmt.Fprintln(w, "  warnings")
	for _, f := range findings {
		fmt.Fprintf(w, "    %s %s: %s\n", strings.ToUpper(f.Severity), f.Code, f.Message)
	}
}

// inspectPrintPools writes the pools of each rank, a rank promised but
// without a pool as such, and the ratio only for a whole set.
func inspectPrintPools(e wire.Engine, row func(string, string, ...any), more func(string, ...any)) {
	label := "KV pools"
	next := func() string { l := label; label = ""; return l }
	if len(e.Ranks) == 0 {
		what := "unknown (give the engine's start-up log: --log SOURCE, or --engine KIND=URL,log=SOURCE)"
		if e.LogSource != nil {
			what = "none printed yet in the log"
		}
		if e.ExpectedRanks > 1 {
			what += fmt.Sprintf("; %d data-parallel ranks expected", e.ExpectedRanks)
		}
		row(next(), "%s", what)
		return
	}
	missing := map[int]bool{}
	for _, m := range e.MissingRanks {
		missing[m] = true
	}
	ranks := slices.Clone(e.Ranks)
	for m := range missing {
		ranks = append(ranks, wire.Rank{DPRank: m, KVTokens: -1})
	}
	slices.SortFunc(ranks, func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
	for _, r := range ranks {
		if r.KVTokens < 0 {
			row(next(), "rank %d: no pool (not printed yet)", r.DPRank)
			continue
		}
		row(next(), "rank %d: %s tokens", r.DPRank, health.Thousands(r.KVTokens))
	}
	src := inspectOr(e.RanksSource, "?")
	if ratio, ok := health.EnginePoolRatio(e); ok {
		more("smallest/largest %.2f (from %s)", ratio, src)
	} else if !health.Whole(e) {
		more("smallest/largest unknown: %d of %d data-parallel ranks printed a pool (from %s)", len(e.Ranks), e.ExpectedRanks, src)
	} else {
		more("(from %s)", src)
	}
	if c := e.PoolCheck; c != nil {
		verdict := "agree"
		if health.PoolsDisagree(e) != nil {
			verdict = "DISAGREE (see the warnings)"
		}
		var parts []string
		for _, r := range c.Ranks {
			parts = append(parts, fmt.Sprintf("rank %d: %s", r.DPRank, health.Thousands(r.KVTokens)))
		}
		more("checked against %s: %s; %s", c.Source, verdict, strings.Join(parts, ", "))
	}
}

// inspectPrintLog writes where an engine's log is read from and how.
func inspectPrintLog(st logsource.Status, row func(string, string, ...any), more func(string, ...any)) {
	row("log", "%s", st.Spec)
	if st.Resolved != "" {
		how := []string{"via " + st.Via}
		if st.Wrapper != "" {
			how = append(how, st.Wrapper+" wrapper")
		}
		more("read %s (%s)", st.Resolved, strings.Join(how, ", "))
	}
	runs := ""
	if st.Runs > 1 {
		runs = fmt.Sprintf(" over %d runs of the engine", st.Runs)
	}
	more("%s engine lines read%s", health.Thousands(st.Lines), runs)
	if len(st.Skipped) > 0 {
		var total int64
		var parts []string
		for _, reason := range slices.Sorted(maps.Keys(st.Skipped)) {
			total += st.Skipped[reason]
			parts = append(parts, fmt.Sprintf("%s %s", health.Thousands(st.Skipped[reason]), reason))
		}
		more("skipped %s lines: %s", health.Thousands(total), strings.Join(parts, ", "))
		if st.LastProblem != "" {
			more("last skipped: %s", st.LastProblem)
		}
	}
	if st.LastError != "" {
		if st.LastLineAt.After(st.LastErrorAt) {
			more("recovered from: %s", st.LastError)
		} else {
			more("ERROR: %s", st.LastError)
		}
	}
	for _, n := range st.Notes {
		more("note: %s", n)
	}
}

// inspectAdvertise says what gateways are offered for the engine, and why.
func inspectAdvertise(e wire.Engine) string {
	listen := strings.Join(e.Listen, ", ")
	switch e.AdvertiseSource {
	case wire.AdvertiseConfig:
		return e.AdvertiseURL + " (advertise_url)"
	case wire.AdvertiseURLHost:
		return e.AdvertiseURL + " (the engine URL)"
	case wire.AdvertiseNodeAddress:
		return e.AdvertiseURL + " (this node's primary address: the engine listens on " + listen + ")"
	case wire.AdvertiseListenAddress:
		return e.AdvertiseURL + " (the engine listens on " + listen + ")"
	}
	if listen != "" {
		return e.URL + " (the engine listens on " + listen + " only; see the warnings)"
	}
	return e.URL + " (where the engine listens is unknown; see the warnings)"
}

func inspectOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

func inspectGiB(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
