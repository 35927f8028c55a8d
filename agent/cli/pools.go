package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/logsource"
	"heft/shared/health"
	"heft/shared/settings"
	"heft/shared/wire"
)

// poolsReport is the --json output. The first five fields are the
// public contract (PRODUCT.md); the rest are extras.
type poolsReport struct {
	Engine     string      `json:"engine"`
	Ranks      []wire.Rank `json:"ranks"`
	MinOverMax float64     `json:"min_over_max"`

	// Complete is false while a rank the launch args or the log's rank
	// markers promise has no pool; MinOverMax is 0 until it has one. It is
	// null when the log cannot show how many ranks there are (DP tags or a
	// shell variable, but no DP size).
	Complete      *bool `json:"complete"`
	ExpectedRanks int   `json:"expected_ranks"`
	MissingRanks  []int `json:"missing_ranks,omitempty"`

	Format     string            `json:"format,omitempty"`
	Version    string            `json:"version,omitempty"`
	Model      string            `json:"model,omitempty"`
	Ready      bool              `json:"ready"`
	Restarts   int               `json:"restarts"`
	DPSize     int               `json:"dp_size,omitempty"`
	LaunchArgs map[string]string `json:"launch_args,omitempty"`
	Notes      []string          `json:"notes,omitempty"`
	Warning    *health.Finding   `json:"warning,omitempty"` // the most severe of Warnings

	Warnings []health.Finding  `json:"warnings,omitempty"`
	Source   *logsource.Status `json:"source,omitempty"`
}

// poolsArgs are the pools command's parsed flags.
type poolsArgs struct {
	kind, log string
	json      bool
	// src are where journald:, docker: and k8s: logs are read from, as
	// the agent's [engine_logs] settings (and their environment
	// variables) say.
	src logsource.Options
}

// runPools reads an engine's start-up log and prints each data-parallel
// rank's KV pool. Exit codes: 0 pools found and no CRITICAL finding, 2
// a CRITICAL finding shown (pools far apart, as inspect) or bad usage, 1
// no pool line or the log cannot be read.
func runPools(args []string, stdio IO) int {
	a, code, ok := parsePools(args, stdio)
	if !ok {
		return code
	}
	report, facts, code, err := a.read()
	if err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent pools: %v\n", err)
		if errors.Is(err, enginelog.ErrNoPools) && (facts.Version != "" || facts.Model != "" || len(facts.LaunchArgs) > 0) {
			fmt.Fprintf(stdio.Err, "heft-agent pools: the log shows a start-up%s but no pool line: it may have failed before sizing its KV cache, or not got that far yet\n",
				poolsDescribe(facts))
		}
		return code
	}
	if a.json {
		enc := json.NewEncoder(stdio.Out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(report); err != nil {
			fmt.Fprintf(stdio.Err, "heft-agent pools: write: %v\n", err)
			return 1
		}
		return report.exitCode()
	}
	poolsTable(stdio.Out, report)
	return report.exitCode()
}

// exitCode is 2 when the report shows a CRITICAL finding, else 0, as
// inspect's: a script can act on pools it would not weigh.
func (r poolsReport) exitCode() int {
	if slices.ContainsFunc(r.Warnings, func(f health.Finding) bool { return f.Severity == wire.SeverityCritical }) {
		return 2
	}
	return 0
}

// parsePools reads the pools command's flags; ok is false, with the exit
// code, when the command should stop (help, or bad flags).
func parsePools(args []string, stdio IO) (a poolsArgs, code int, ok bool) {
	fs := flag.NewFlagSet("heft-agent pools", flag.ContinueOnError)
	kind := fs.String("engine", "", "the engine that wrote the log: vllm, sglang, llamacpp, ollama or mlx (default: the kind whose pool lines the log holds)")
	fs.StringVar(&a.log, "log", "", "where the engine's start-up log is (`SOURCE`): "+logsource.Usage)
	fs.BoolVar(&a.json, "json", false, "print JSON instead of a table")
	sourceFlags(fs, &a.src)
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "usage: heft-agent pools [--engine vllm|sglang|llamacpp|ollama|mlx] --log FILE [--json]")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Reads an engine's start-up log and prints each data-parallel rank's KV pool.")
		fmt.Fprintln(w, "FILE may also be a glob (the newest match), journald:UNIT, docker:CONTAINER or k8s:NAMESPACE/POD/CONTAINER.")
		fmt.Fprintln(w, "Without --engine, the kind whose pool lines the log holds is used.")
		fmt.Fprintln(w, "\nExit 0: pools found, no CRITICAL warning; 2: a CRITICAL warning shown (or bad flags);")
		fmt.Fprintln(w, "1: no pool line, or the log cannot be read.")
		fmt.Fprintln(w)
		settings.PrintFlags(w, fs)
	}
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return a, code, false
	}
	if a.log == "" {
		usage(stdio.Err)
		fmt.Fprintln(stdio.Err, "heft-agent pools: --log is required")
		return a, 2, false
	}
	a.kind = strings.ToLower(strings.TrimSpace(*kind))
	if a.kind == wire.EngineMLX {
		return a, 0, true // read says mlx has no pool
	}
	if _, err := engine.LogGrammar(a.kind); a.kind != "" && err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent pools: unknown engine %q: pools reads %s start-up logs\n", *kind, strings.Join(poolKinds, ", "))
		return a, 2, false
	}
	return a, 0, true
}

// poolKinds are the kinds whose logs pools reads, in the order a log of
// unknown kind is tried.
var poolKinds = []string{wire.EngineVLLM, wire.EngineSGLang, wire.EngineLlamaCpp, wire.EngineOllama}

// readKind reads a log of kind with its grammar.
func readKind(kind string, each func(yield func(string)) error) (enginelog.Facts, error) {
	g, err := engine.LogGrammar(kind)
	if err != nil {
		return enginelog.Facts{}, err
	}
	return enginelog.ReadEach(g, each)
}

// otherPoolLines says what the pool lines of every kind but kind look like.
func otherPoolLines(kind string) string {
	var all []string
	for _, k := range poolKinds {
		if g, err := engine.LogGrammar(k); err == nil && k != kind {
			all = append(all, g.PoolLines)
		}
	}
	// Ollama reads llama.cpp's lines and more: a kind's list that another
	// one's holds whole is said once, in the longer.
	var out []string
	for i, p := range all {
		held := false
		for j, q := range all {
			if i != j && strings.Contains(q, p) && (p != q || j < i) {
				held = true
			}
		}
		if !held {
			out = append(out, p)
		}
	}
	return strings.Join(out, "; ")
}

// mlxServerLine reports whether line is mlx_lm.server's own (its banner,
// or a warning naming its module's file): a log without any kind's pool
// lines that holds one is mlx-lm's, which has no pool, not a vLLM log
// without one.
func mlxServerLine(line string) bool {
	return strings.Contains(line, "Starting MLX Server") || strings.Contains(line, "mlx_lm/server.py") || strings.Contains(line, "mlx_lm.server")
}

// errNoPoolEngine is mlx-lm's answer: its server allocates KV cache per
// request and has no pool to read.
var errNoPoolEngine = errors.New("mlx-lm's server exposes no KV pool: it allocates each request's cache as it goes, " +
	"so there is no pool to read and no data-parallel ranks to compare; the agent measures it by probing alone")

// sourceFlags are where journald:, docker: and k8s: logs are found: the
// agent's [engine_logs] settings, by flag or by the environment variables
// the agent reads, so a DaemonSet's setup can be checked by hand.
func sourceFlags(fs *flag.FlagSet, o *logsource.Options) {
	def := func(env, fallback string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return fallback
	}
	fs.StringVar(&o.PodsRoot, "pods-root", def("HEFT_ENGINE_LOGS_PODS_ROOT", logsource.DefaultPodsRoot),
		"the kubelet's pod logs, for k8s: (env HEFT_ENGINE_LOGS_PODS_ROOT)")
	fs.StringVar(&o.JournalDirectory, "journal-directory", def("HEFT_ENGINE_LOGS_JOURNAL_DIRECTORY", ""),
		"journal files journald: reads (journalctl --directory; env HEFT_ENGINE_LOGS_JOURNAL_DIRECTORY; default the system journal)")
	fs.StringVar(&o.DockerSocket, "docker-socket", def("HEFT_ENGINE_LOGS_DOCKER_SOCKET", ""),
		"the Docker Engine API's socket, for docker: (env HEFT_ENGINE_LOGS_DOCKER_SOCKET; default /var/run/docker.sock)")
	fs.StringVar(&o.DockerRoot, "docker-root", def("HEFT_ENGINE_LOGS_DOCKER_ROOT", ""),
		"Docker's data root, read when the socket cannot be (env HEFT_ENGINE_LOGS_DOCKER_ROOT; default /var/lib/docker)")
}

// read reads the log and judges its pools. An error comes with its exit
// code; with ErrNoPools, facts say what else the log held.
func (a poolsArgs) read() (poolsReport, enginelog.Facts, int, error) {
	if a.kind == wire.EngineMLX {
		return poolsReport{}, enginelog.Facts{Engine: a.kind}, 1, errNoPoolEngine
	}
	src, err := logsource.Open(a.log, a.src, nil)
	if err != nil {
		return poolsReport{}, enginelog.Facts{}, 2, err
	}
	var readErr error
	var lines []string
	kind := a.kind
	if kind == "" {
		// Read once, then try each kind: the first whose pool lines the
		// log holds is the engine's.
		readErr = src.ReadAll(context.Background(), logsource.Handler{Line: func(l string) { lines = append(lines, l) }})
		kind = ""
		for _, k := range poolKinds {
			if f, err := readKind(k, replay(lines)); err == nil && len(f.Ranks) > 0 {
				kind = k
				break
			}
		}
		if kind == "" && readErr == nil && slices.ContainsFunc(lines, mlxServerLine) {
			return poolsReport{}, enginelog.Facts{Engine: wire.EngineMLX}, 1, fmt.Errorf("%s: the log is mlx_lm.server's: %w", a.log, errNoPoolEngine)
		}
		kind = cmp.Or(kind, poolKinds[0])
	}
	facts, err := readKind(kind, func(yield func(string)) error {
		if a.kind == "" {
			return replay(lines)(yield)
		}
		readErr = src.ReadAll(context.Background(), logsource.Handler{Line: yield})
		return readErr
	})
	if readErr != nil {
		return poolsReport{}, facts, 1, fmt.Errorf("cannot read the log: %w", readErr)
	}
	if err != nil && a.kind == "" && errors.Is(err, enginelog.ErrNoPools) {
		// No kind's pool lines: say what every kind's look like, not only
		// those of the kind the log was read as.
		err = fmt.Errorf("%w; nor any other kind's: %s", err, otherPoolLines(kind))
	}
	if err != nil {
		return poolsReport{}, facts, 1, fmt.Errorf("%s: %w", a.log, err)
	}
	report := poolsReport{
		Engine:     facts.Engine,
		Ranks:      facts.Ranks,
		MinOverMax: poolsMinOverMax(facts),
		Format:     facts.Format,
		Version:    facts.Version,
		Model:      facts.Model,
		Ready:      facts.Ready,
		Restarts:   facts.Restarts,
		DPSize:     facts.DPSize,
		LaunchArgs: facts.LaunchArgs,
		Notes:      facts.Notes,
	}
	if facts.RankCountUnknown == "" {
		report.Complete = &facts.Complete
	}
	report.ExpectedRanks, report.MissingRanks = facts.ExpectedRanks, facts.MissingRanks
	report.Warnings = poolsWarnings(facts)
	if len(report.Warnings) > 0 {
		report.Warning = &report.Warnings[0]
	}
	status := src.Status()
	report.Source = &status
	return report, facts, 0, nil
}

// replay yields lines read before.
func replay(lines []string) func(func(string)) error {
	return func(yield func(string)) error {
		for _, l := range lines {
			yield(l)
		}
		return nil
	}
}

// poolsMinOverMax is smallest/largest pool rounded to 4 decimals: 1 with
// one rank, 0 when every pool is empty or a rank's pool is missing (the
// smallest is then unknown, and may be nothing).
func poolsMinOverMax(f enginelog.Facts) float64 {
	ranks := f.Ranks
	if !f.Complete {
		return 0
	}
	if len(ranks) == 1 {
		return 1
	}
	ratio, _, _, ok := health.PoolRatio(ranks)
	if !ok {
		return 0
	}
	return math.Round(ratio*1e4) / 1e4
}

// poolsWarnings are the findings about the pools, most severe first, by
// the rules inspect and the coordinator use (health.PoolFindings): an
// imbalance among the pools found, a warning only while the set is
// incomplete, and the ranks missing from the set, with what promised them.
func poolsWarnings(f enginelog.Facts) []health.Finding {
	if len(f.Ranks) == 0 {
		return nil
	}
	complete := f.Complete
	out := health.PoolFindings(wire.Engine{Ranks: f.Ranks, ExpectedRanks: f.ExpectedRanks, Complete: &complete, MissingRanks: f.MissingRanks},
		health.DefaultThresholds())
	for i := range out {
		if out[i].Code == wire.CodePoolsIncomplete {
			out[i] = health.Incomplete(len(f.Ranks), f.ExpectedRanks, f.ExpectedFrom, f.MissingRanks)
			if f.RankCountUnknown != "" {
				out[i].Message = f.RankCountUnknown + ". Until it is known, the smallest pool is unknown: no smallest/largest ratio is given, and the set is not judged balanced."
			}
		}
	}
	health.Sort(out)
	return out
}

// incompleteWarning is the pools_incomplete warning's message, or "".
func (r poolsReport) incompleteWarning() string {
	for _, f := range r.Warnings {
		if f.Code == wire.CodePoolsIncomplete {
			return f.Message
		}
	}
	return ""
}

func poolsDescribe(f enginelog.Facts) string {
	var parts []string
	if f.Version != "" {
		parts = append(parts, "version "+f.Version)
	}
	if f.Model != "" {
		parts = append(parts, "model "+f.Model)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func poolsTable(w io.Writer, r poolsReport) {
	head := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(head, "engine\t%s\n", r.Engine)
	if r.Version != "" {
		fmt.Fprintf(head, "version\t%s\n", r.Version)
	}
	if r.Model != "" {
		fmt.Fprintf(head, "model\t%s\n", r.Model)
	}
	fmt.Fprintf(head, "pool format\t%s\n", r.Format)
	ready := "no (the log has no ready line yet)"
	if r.Ready {
		ready = "yes"
	}
	fmt.Fprintf(head, "ready\t%s\n", ready)
	if src := r.Source; src != nil && (src.Kind != logsource.KindFile || (src.Wrapper != "" && src.Wrapper != "none")) {
		fmt.Fprintf(head, "log\t%s, %s lines, %s wrapper\n", src.Resolved, health.Thousands(src.Lines), src.Wrapper)
	}
	if r.Restarts > 0 {
		fmt.Fprintf(head, "start-ups\t%d in this log; the pools are the last one's\n", r.Restarts+1)
	}
	head.Flush()
	fmt.Fprintln(w)

	largest := int64(0)
	for _, rk := range r.Ranks {
		largest = max(largest, rk.KVTokens)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DP rank\tKV tokens\tof largest\t")
	for _, rk := range r.Ranks {
		share := "-"
		if largest > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(rk.KVTokens)/float64(largest))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t\n", rk.DPRank, health.Thousands(rk.KVTokens), share)
	}
	tw.Flush()
	fmt.Fprintln(w)
	complete := r.Complete != nil && *r.Complete
	switch {
	case r.Complete == nil:
		fmt.Fprintf(w, "smallest/largest: unknown: %d data-parallel ranks printed a pool, and the log does not show how many there are\n", len(r.Ranks))
	case !complete:
		fmt.Fprintf(w, "smallest/largest: unknown: %d of %d data-parallel ranks printed a pool\n", len(r.Ranks), r.ExpectedRanks)
	case len(r.Ranks) == 1:
		fmt.Fprintln(w, "one data-parallel rank: nothing to compare")
	default:
		fmt.Fprintf(w, "smallest/largest: %.4f\n", r.MinOverMax)
	}

	for _, n := range r.Notes {
		if !complete && strings.HasPrefix(r.incompleteWarning(), n) {
			continue // said by the warning below
		}
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, f := range r.Warnings {
		fmt.Fprintf(w, "\n%s %s: %s\n", strings.ToUpper(f.Severity), f.Code, f.Message)
	}
	if len(r.Warnings) == 0 && complete && len(r.Ranks) > 1 {
		fmt.Fprintln(w, "the data-parallel pools are even")
	}
}
