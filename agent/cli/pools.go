package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"heft/agent/enginelog"
	"heft/shared/health"
	"heft/shared/wire"
)

// poolsReport is the --json output. The first three fields are the
// public contract (PRODUCT.md); the rest are extras.
type poolsReport struct {
	Engine     string            `json:"engine"`
	Ranks      []wire.Rank       `json:"ranks"`
	MinOverMax float64           `json:"min_over_max"`
	Format     string            `json:"format,omitempty"`
	Version    string            `json:"version,omitempty"`
	Model      string            `json:"model,omitempty"`
	Ready      bool              `json:"ready"`
	Restarts   int               `json:"restarts"`
	DPSize     int               `json:"dp_size,omitempty"`
	LaunchArgs map[string]string `json:"launch_args,omitempty"`
	Notes      []string          `json:"notes,omitempty"`
	Warning    *health.Finding   `json:"warning,omitempty"`
}

// runPools reads an engine's start-up log and prints each data-parallel
// rank's KV pool. Exit codes: 0 pools found, 1 no pool line or the log
// cannot be read, 2 bad usage.
func runPools(args []string, stdio IO) int {
	fs := flag.NewFlagSet("pools", flag.ContinueOnError)
	fs.SetOutput(stdio.Err)
	engine := fs.String("engine", "", "the engine that wrote the log: vllm or sglang")
	logPath := fs.String("log", "", "the engine's start-up log file")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(stdio.Err, "usage: heft-agent pools --engine vllm|sglang --log FILE [--json]")
		fmt.Fprintln(stdio.Err)
		fmt.Fprintln(stdio.Err, "Reads an engine's start-up log and prints each data-parallel rank's KV pool.")
		fmt.Fprintln(stdio.Err)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stdio.Err, "heft-agent pools: "+format+"\n", a...)
		return code
	}
	switch {
	case fs.NArg() > 0:
		return fail(2, "unexpected argument %q (flags: --engine, --log, --json)", fs.Arg(0))
	case *engine == "" || *logPath == "":
		fs.Usage()
		return fail(2, "--engine and --log are both required")
	}
	kind := strings.ToLower(strings.TrimSpace(*engine))
	if kind != wire.EngineVLLM && kind != wire.EngineSGLang {
		return fail(2, "unknown engine %q: pools reads vllm and sglang start-up logs (the other engines print no per-rank KV pool)", *engine)
	}

	file, err := os.Open(*logPath)
	if err != nil {
		return fail(1, "cannot read the log: %v", err)
	}
	defer file.Close()
	facts, err := enginelog.Read(kind, file)
	if errors.Is(err, enginelog.ErrNoPools) {
		code := fail(1, "%s: %v", *logPath, err)
		if facts.Version != "" || facts.Model != "" || len(facts.LaunchArgs) > 0 {
			fmt.Fprintf(stdio.Err, "heft-agent pools: the log shows a start-up%s but no pool line: it may have failed before sizing its KV cache, or not got that far yet\n",
				poolsDescribe(facts))
		}
		return code
	}
	if err != nil {
		return fail(1, "%s: %v", *logPath, err)
	}

	report := poolsReport{
		Engine:     facts.Engine,
		Ranks:      facts.Ranks,
		MinOverMax: poolsMinOverMax(facts.Ranks),
		Format:     facts.Format,
		Version:    facts.Version,
		Model:      facts.Model,
		Ready:      facts.Ready,
		Restarts:   facts.Restarts,
		DPSize:     facts.DPSize,
		LaunchArgs: facts.LaunchArgs,
		Notes:      facts.Notes,
		Warning:    health.Pools(facts.Ranks, health.DefaultThresholds()),
	}
	if *asJSON {
		enc := json.NewEncoder(stdio.Out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(report); err != nil {
			return fail(1, "write: %v", err)
		}
		return 0
	}
	poolsTable(stdio.Out, report)
	return 0
}

// poolsMinOverMax is smallest/largest pool rounded to 4 decimals: 1 with
// one rank, 0 when every pool is empty.
func poolsMinOverMax(ranks []wire.Rank) float64 {
	if len(ranks) == 1 {
		return 1
	}
	ratio, _, _, ok := health.PoolRatio(ranks)
	if !ok {
		return 0
	}
	return math.Round(ratio*1e4) / 1e4
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
	if len(r.Ranks) == 1 {
		fmt.Fprintln(w, "one data-parallel rank: nothing to compare")
	} else {
		fmt.Fprintf(w, "smallest/largest: %.4f\n", r.MinOverMax)
	}

	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	switch {
	case r.Warning != nil:
		fmt.Fprintf(w, "\n%s %s: %s\n", strings.ToUpper(r.Warning.Severity), r.Warning.Code, r.Warning.Message)
	case len(r.Ranks) > 1:
		fmt.Fprintln(w, "the data-parallel pools are even")
	}
}
