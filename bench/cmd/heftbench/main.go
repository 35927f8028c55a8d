// Command heftbench is the driver of `make bench` (scripts/bench.sh): it
// runs the benchmark areas, prints one markdown table per area and writes
// them all to a file. See bench/README.md.
//
//	heftbench [--quick] [--areas 1,2,5] [--bin DIR] [--out FILE] [--runs N] [--agents 1000,5000,10000]
//	          [--routing-seeds N] [--routing-cell 30s] [--routing-loads 30,60,90] [--weight-min 0.25] [--cases slows,restart,throttle,joins]
//
// Without --bin it builds the binaries it needs into a temporary folder.
// `heftbench follow-log` is the child process of area 6's log benchmark.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"heft/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	if len(os.Args) > 1 && os.Args[1] == bench.FollowLogCommand {
		code = bench.FollowLogMain(ctx, os.Args[2:], os.Stdout, os.Stderr)
	} else {
		code = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("heftbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "run a reduced version of every area (exercises the harness; not the product's numbers)")
	areas := fs.String("areas", "", "comma-separated areas to run, 1–11 (default all)")
	bin := fs.String("bin", "", "folder with heft-agent, heft-coordinator, heft-sim, heft-sync, swarm, heftbench (default: build them)")
	out := fs.String("out", "", "also write the report to this markdown file")
	runs := fs.Int("runs", 0, "runs per cell (default 3, quick 1)")
	agents := fs.String("agents", "", "area 5 swarm sizes, comma-separated (default 1000,5000,10000; quick 50)")
	logMB := fs.Int64("log-mb", 0, "area 6: how many MB the followed log grows (default 1000; quick 20)")
	window := fs.Duration("agent-window", 0, "area 6: how long the agent is sampled (default 60s; quick 3s)")
	routingSeeds := fs.Int("routing-seeds", 0, "area 9: arrival schedules per load (default 2; quick 1)")
	routingCell := fs.Duration("routing-cell", 0, "area 9: how long arrivals last in each cell (default 30s; quick 3s)")
	routingLoads := fs.String("routing-loads", "", "area 9: offered loads in percent of the fleet's true capacity, comma-separated (default 30,60,90; quick 60)")
	weightMin := fs.Float64("weight-min", 0, "area 9: the coordinator's weight_min, its smallest weight (default: the coordinator's, 0.25)")
	cases := fs.String("cases", "", "area 11: comma-separated cases to run: slows, restart, throttle, joins (default all)")
	keep := fs.Bool("keep", false, "leave the work folder (every process's logs, configs and state) in place and print its path")
	probeBusy := fs.String("probe-busy", "", "area 11: the agents' probe.busy: wait, drain or passive-only (default wait)")
	changeWindow := fs.Duration("change-window", 0, "area 11: the agents' passive and pace windows, probe.passive_window and probe.pace_window (default: the agents'; quick 5s)")
	paceWindow := fs.Duration("pace-window", 0, "area 11: the agents' pace window alone, probe.pace_window, over --change-window")
	lateOracle := fs.Duration("late-oracle", 0, "area 11: also route every case by the true capacities set this long after the change (e.g. 2s; default: not)")
	slowFactor := fs.Float64("slow-factor", 0, "area 11: how many times slower the fast worker becomes in the slows, restart and throttle cases (default 2: half speed)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "heftbench: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	opts := bench.Options{Quick: *quick, Runs: *runs, Bin: *bin, LogBytes: *logMB * 1_000_000, AgentWindow: *window,
		RoutingSeeds: *routingSeeds, RoutingCell: *routingCell, WeightMin: *weightMin, ProbeBusy: *probeBusy, ChangeWindow: *changeWindow, PaceWindow: *paceWindow, LateOracle: *lateOracle, SlowFactor: *slowFactor, Keep: *keep, Progress: stderr, Out: stdout}
	if *cases != "" {
		opts.ChangeCases = strings.Split(*cases, ",")
	}
	var err error
	if opts.Areas, err = ints(*areas); err != nil {
		fmt.Fprintf(stderr, "heftbench: --areas: %v\n", err)
		return 2
	}
	if opts.RoutingLoads, err = ints(*routingLoads); err != nil {
		fmt.Fprintf(stderr, "heftbench: --routing-loads: %v\n", err)
		return 2
	}
	if opts.Agents, err = ints(*agents); err != nil {
		fmt.Fprintf(stderr, "heftbench: --agents: %v\n", err)
		return 2
	}
	if opts.Bin == "" {
		dir, err := os.MkdirTemp("", "heftbench-bin-")
		if err != nil {
			fmt.Fprintf(stderr, "heftbench: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		wd, _ := os.Getwd()
		root, err := bench.ModuleRoot(wd)
		if err != nil {
			fmt.Fprintf(stderr, "heftbench: %v\n", err)
			return 1
		}
		fmt.Fprintln(stderr, "heftbench: building binaries…")
		t0 := time.Now()
		if err := bench.Build(ctx, root, dir); err != nil {
			fmt.Fprintf(stderr, "heftbench: %v\n", err)
			return 1
		}
		fmt.Fprintf(stderr, "heftbench: built in %s\n", time.Since(t0).Round(time.Second))
		opts.Bin = dir
	}
	report, err := bench.Run(ctx, opts)
	if report != nil && *out != "" {
		if werr := writeFile(*out, report.Markdown()); werr != nil {
			fmt.Fprintf(stderr, "heftbench: %v\n", werr)
			return 1
		}
		fmt.Fprintf(stderr, "heftbench: wrote %s\n", *out)
	}
	if err != nil {
		fmt.Fprintf(stderr, "heftbench: %v\n", err)
		return 1
	}
	return 0
}

func writeFile(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// ints parses "1,2,5"; "" is nil.
func ints(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
