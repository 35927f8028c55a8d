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

// inspectDefaultTargets lists the engines' default ports on this host.
// Tests replace it.
var inspectDefaultTargets = func() []inspectTarget {
	var out []inspectTarget
	for _, p := range engine.DefaultPorts() {
		out = append(out, inspectTarget{URL: fmt.Sprintf("http://127.0.0.1:%d", p.Port), Kinds: strings.Join(p.Kinds, "/")})
	}
	return out
}

// inspectOpenGPUs opens the GPU source. Tests replace it.
var inspectOpenGPUs = gpu.Open

// inspectLoadConfig reads the agent config file for --config: node name
// and engines. Neither coordinator nor token is needed to inspect, so the
// config is not validated as a whole.
var inspectLoadConfig = func(path string) (node string, engines []collect.EngineSpec, err error) {
	cfg, err := config.Read(path, nil, os.Getenv)
	if err != nil {
		return "", nil, err
	}
	for _, e := range cfg.Engines {
		engines = append(engines, collect.EngineSpec{Kind: e.Kind, URL: e.URL, Log: e.Log, Model: e.Model})
	}
	return cfg.Node.Name, engines, nil
}

// inspectEngineFlags collects repeated --engine KIND=URL[,log=PATH][,model=NAME].
type inspectEngineFlags []collect.EngineSpec

func (f *inspectEngineFlags) String() string { return "" }

func (f *inspectEngineFlags) Set(v string) error {
	e, err := config.ParseEngine(v)
	if err != nil {
		return err
	}
	spec := collect.EngineSpec{Kind: strings.ToLower(e.Kind), URL: e.URL, Log: e.Log, Model: e.Model}
	if _, err := engine.New(engine.Config{Kind: spec.Kind, URL: spec.URL}, nil); err != nil {
		return err
	}
	*f = append(*f, spec)
	return nil
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
	fs := flag.NewFlagSet("heft-agent inspect", flag.ContinueOnError)
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "usage: heft-agent inspect [--json] [--config FILE] [--engine KIND=URL[,log=PATH][,model=NAME]]... [--node NAME] [--timeout 5s]")
		fmt.Fprintln(w, "\nShows this host's GPUs and engines: models, load, KV pools per data-parallel rank, launch")
		fmt.Fprintln(w, "arguments, capacity keys, foreign GPU processes and warnings. Without --engine or --config it")
		fmt.Fprintln(w, "looks for engines on their default ports on 127.0.0.1 (vllm 8000, sglang 30000,")
		fmt.Fprintln(w, "llamacpp/mlx 8080, ollama 11434). KIND is one of "+strings.Join(wire.EngineKinds, ", ")+".")
		fmt.Fprintln(w)
		settings.PrintFlags(w, fs)
	}
	jsonOut := fs.Bool("json", false, "print JSON instead of text")
	configPath := fs.String("config", "", "agent config `file`: its [node] name and [[engine]] entries")
	node := fs.String("node", "", "node `name` used in capacity keys (default: the config's, else the host name)")
	timeout := fs.Duration("timeout", engine.DefaultTimeout, "limit for each request to an engine")
	var engines inspectEngineFlags
	fs.Var(&engines, "engine", "an engine to read, `KIND=URL[,log=PATH][,model=NAME]`; repeatable")
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return code
	}
	if *timeout <= 0 {
		fmt.Fprintln(stdio.Err, "heft-agent inspect: --timeout must be positive")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logger := hclog.New(&hclog.LoggerOptions{Name: "inspect", Level: hclog.Warn, Output: stdio.Err})

	specs := []collect.EngineSpec(engines)
	nodeName := *node
	if *configPath != "" {
		cfgNode, cfgEngines, err := inspectLoadConfig(*configPath)
		if err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent inspect: %v\n", err)
			return 1
		}
		if nodeName == "" {
			nodeName = cfgNode
		}
		specs = inspectMerge(specs, cfgEngines)
	}
	var notes []string
	if len(specs) == 0 {
		specs, notes = inspectDiscover(ctx, *timeout)
	}

	src, gpuErr := inspectOpenGPUs(logger)
	if src == nil {
		fmt.Fprintf(stdio.Err, "heft-agent inspect: no gpu source: %v\n", gpuErr)
		return 1
	}
	defer src.Close()
	cfg := collect.Config{Node: nodeName, Engines: specs, Timeout: *timeout}
	if gpuErr != nil {
		cfg.GPUError = gpuErr.Error()
	}
	col, err := collect.New(cfg, src, logger)
	if err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent inspect: %v\n", err)
		return 2
	}
	if err := col.ReadLogsOnce(ctx); err != nil {
		notes = append(notes, err.Error())
	}
	snap := col.Snapshot(ctx)

	report := inspectReport{Host: snap.Host, GPUs: snap.GPUs, GPUError: snap.GPUError, Engines: snap.Engines,
		Warnings: []inspectWarning{}, Notes: notes}
	if report.Notes == nil {
		report.Notes = []string{}
	}
	warnings := map[string][]health.Finding{}
	for _, e := range snap.Engines {
		fs := health.Engine(e, snap.GPUs, health.DefaultThresholds())
		health.Sort(fs)
		warnings[e.URL] = fs
		for _, f := range fs {
			report.Warnings = append(report.Warnings, inspectWarning{Engine: e.URL, Code: f.Code, Severity: f.Severity, Message: f.Message})
		}
	}

	if *jsonOut {
		enc := json.NewEncoder(stdio.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(report); err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent inspect: %v\n", err)
			return 1
		}
		return 0
	}
	inspectPrint(stdio.Out, snap, warnings, notes)
	return 0
}

// inspectMerge adds the config's engines to those named by flags; a flag
// wins over a config entry for the same URL.
func inspectMerge(flags, fromConfig []collect.EngineSpec) []collect.EngineSpec {
	out := append([]collect.EngineSpec(nil), flags...)
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

// inspectDiscover looks for engines on the default ports of this host.
func inspectDiscover(ctx context.Context, timeout time.Duration) ([]collect.EngineSpec, []string) {
	var specs []collect.EngineSpec
	var notes, tried []string
	for _, t := range inspectDefaultTargets() {
		tried = append(tried, fmt.Sprintf("%s %s", t.Kinds, strings.TrimPrefix(t.URL, "http://")))
		if !engine.PortOpen(ctx, t.URL, min(timeout, time.Second)) {
			continue
		}
		kind, err := engine.Detect(ctx, t.URL, timeout)
		if err != nil {
			notes = append(notes, fmt.Sprintf("something listens at %s but was not recognised: %v", t.URL, err))
			continue
		}
		specs = append(specs, collect.EngineSpec{Kind: kind, URL: t.URL})
	}
	if len(specs) == 0 {
		notes = append(notes, fmt.Sprintf("no engine found on the default ports (%s); pass --engine or --config", strings.Join(tried, ", ")))
	}
	return specs, notes
}

// inspectPrint writes the human report.
func inspectPrint(w io.Writer, snap wire.Snapshot, warnings map[string][]health.Finding, notes []string) {
	h := snap.Host
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
	fmt.Fprintf(w, "node  %s\nhost  %s\n\n", snap.Node, strings.Join(hostLine, "  "))

	if len(snap.GPUs) == 0 {
		reason := snap.GPUError
		if reason == "" {
			reason = "none reported"
		}
		fmt.Fprintf(w, "no GPUs found (%s)\n", reason)
	} else {
		fmt.Fprintln(w, "GPUs")
		if snap.GPUError != "" {
			fmt.Fprintf(w, "  note: %s\n", snap.GPUError)
		}
		for _, g := range snap.GPUs {
			inspectPrintGPU(w, g)
		}
	}

	for _, e := range snap.Engines {
		fmt.Fprintln(w)
		inspectPrintEngine(w, e, warnings[e.URL])
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
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
