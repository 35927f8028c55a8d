package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent"
	"heft/agent/collect"
	"heft/agent/config"
	"heft/agent/engine"
	"heft/agent/gpu"
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

// inspectEngineFlags collects repeated --engine KIND=URL[,log=PATH][,model=NAME].
type inspectEngineFlags []engine.Config

func (f *inspectEngineFlags) String() string { return "" }

func (f *inspectEngineFlags) Set(v string) error {
	e, err := config.ParseEngine(v)
	if err != nil {
		return err
	}
	ec := engine.Config{Kind: strings.ToLower(e.Kind), URL: e.URL, Log: e.Log, Model: e.Model}
	if _, err := engine.New(ec, nil); err != nil {
		return err
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
}

// inspectReport is inspect's JSON output.
type inspectReport struct {
	Host     wire.Host        `json:"host"`
	GPUs     []wire.GPU       `json:"gpus"`
	GPUError string           `json:"gpu_error"`
	Engines  []wire.Engine    `json:"engines"`
	Warnings []inspectWarning `json:"warnings"`
	// Notes say what inspect looked for and did not find.
	Notes []string `json:"notes"`

	node     string                      // the snapshot's node, for the text report
	findings map[string][]health.Finding // per engine URL, for the text report
}

type inspectWarning struct {
	Engine   string `json:"engine"`
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// runInspect shows what the agent sees on this host. It reports findings
// and exits 0 even when an engine cannot be read; bad flags exit 2, an
// unreadable config file 1.
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
		return 0
	}
	inspectPrint(stdio.Out, rep)
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
		fmt.Fprintln(w, "usage: heft-agent inspect [--json] [--config FILE] [--engine KIND=URL[,log=PATH][,model=NAME]]... [--node NAME] [--timeout 5s]")
		fmt.Fprintln(w, "\nShows this host's GPUs and engines: models, load, KV pools per data-parallel rank, launch")
		fmt.Fprintln(w, "arguments, capacity keys, foreign GPU processes and warnings. Without --engine or --config it")
		fmt.Fprintln(w, "looks for engines on their default ports on 127.0.0.1 ("+strings.Join(ports[:min(2, len(ports))], ", ")+",")
		fmt.Fprintln(w, strings.Join(ports[min(2, len(ports)):], ", ")+"). KIND is one of "+strings.Join(wire.EngineKinds, ", ")+".")
		fmt.Fprintln(w)
		settings.PrintFlags(w, fs)
	}
	fs.BoolVar(&a.json, "json", false, "print JSON instead of text")
	fs.StringVar(&a.configPath, "config", "", "agent config `file`: its [node] name and [[engine]] entries")
	fs.StringVar(&a.node, "node", "", "node `name` used in capacity keys (default: the config's, else the host name)")
	fs.DurationVar(&a.timeout, "timeout", engine.DefaultTimeout, "limit for each request to an engine")
	var engines inspectEngineFlags
	fs.Var(&engines, "engine", "an engine to read, `KIND=URL[,log=PATH][,model=NAME]`; repeatable")
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return a, code, false
	}
	if a.timeout <= 0 {
		fmt.Fprintln(stdio.Err, "heft-agent inspect: --timeout must be positive")
		return a, 2, false
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
	}
	var notes []string
	if len(engines) == 0 {
		engines, notes = inspectDiscover(ctx, deps.targets(), a.timeout)
	}
	for i := range engines {
		engines[i].Timeout = a.timeout
	}

	src, gpuErr := deps.openGPUs(logger)
	if src == nil {
		return inspectReport{}, 1, fmt.Errorf("no gpu source: %v", gpuErr)
	}
	defer src.Close()
	cfg := collect.Config{Node: nodeName, Engines: engines}
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
		Warnings: []inspectWarning{}, Notes: notes, node: snap.Node, findings: map[string][]health.Finding{}}
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
// wins over a config entry for the same URL.
func inspectMerge(flags, fromConfig []engine.Config) []engine.Config {
	out := append([]engine.Config(nil), flags...)
	for _, c := range fromConfig {
		dup := false
		for _, f := range flags {
			if strings.TrimRight(f.URL, "/") == strings.TrimRight(c.URL, "/") {
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
		inspectPrintEngine(w, e, rep.findings[e.URL])
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

func inspectPrintEngine(w io.Writer, e wire.Engine, findings []health.Finding) {
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
	if len(e.Ranks) > 0 {
		for i, r := range e.Ranks {
			label := "KV pools"
			if i > 0 {
				label = ""
			}
			row(label, "rank %d: %s tokens", r.DPRank, health.Thousands(r.KVTokens))
		}
		src := inspectOr(e.RanksSource, "?")
		if ratio, _, _, ok := health.PoolRatio(e.Ranks); ok {
			more("smallest/largest %.2f (from %s)", ratio, src)
		} else {
			more("(from %s)", src)
		}
	} else {
		row("KV pools", "unknown (pass the engine's start-up log: --engine KIND=URL,log=PATH)")
	}
	if len(e.LaunchArgs) > 0 {
		row("launch args", "%s", strings.Join(e.LaunchArgs, " "))
		more("(from %s)", e.LaunchArgsSource)
	} else {
		row("launch args", "unknown")
	}
	row("capacity key", "%s", inspectOr(e.CapacityKey, "none (model unknown)"))
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

func inspectOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

func inspectGiB(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
