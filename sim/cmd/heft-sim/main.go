// Command heft-sim runs a simulated inference engine until SIGINT or
// SIGTERM and prints its URL on stdout. See package heft/sim for the model.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"heft/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses args, starts the sim, prints its URL and serves until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, listen, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "heft-sim: %v\n", err)
		return 2
	}
	srv, err := sim.Start(cfg, listen)
	if err != nil {
		fmt.Fprintf(stderr, "heft-sim: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, srv.URL())
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "heft-sim: close: %v\n", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (sim.Config, string, error) {
	var cfg sim.Config
	var kv string
	fs := flag.NewFlagSet("heft-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Flavor, "flavor", sim.FlavorVLLM, "engine to imitate: "+strings.Join(sim.Flavors, "|"))
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on (port 0 = any free port)")
	fs.StringVar(&cfg.Model, "model", sim.DefaultModel, "served model name")
	fs.StringVar(&cfg.Version, "version", "", "engine version to report (default: per flavour)")
	fs.Float64Var(&cfg.SingleTPS, "single-tps", 0, "tok/s of one request alone (required)")
	fs.Float64Var(&cfg.Batch16TPS, "batch16-tps", 0, "total tok/s of 16 concurrent requests, per rank (required)")
	fs.IntVar(&cfg.DP, "dp", 1, "data-parallel ranks (vllm, sglang)")
	fs.StringVar(&kv, "kv-tokens", "", "KV pool per rank in tokens, comma-separated, one value or one per rank (default 100000)")
	fs.Float64Var(&cfg.ColdFactor, "cold-factor", 1, "steps are this many times slower while cold")
	fs.Float64Var(&cfg.ColdSeconds, "cold-seconds", 0, "how long the engine stays cold after start")
	fs.StringVar(&cfg.LogPath, "log", "", "write the engine's start-up log to this file")
	fs.IntVar(&cfg.PromptTokens, "prompt-tokens", 0, "pool cost of every prompt (default: estimated from its words)")
	fs.IntVar(&cfg.MaxRunning, "max-running", 0, "running sequences per rank (default: per flavour)")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed for natural response lengths")
	fs.BoolVar(&cfg.Faults.IgnoreMinTokens, "fault-ignore-min-tokens", false, "fault: ignore min_tokens and ignore_eos")
	fs.IntVar(&cfg.Faults.UsageExtra, "fault-usage-extra", 0, "fault: add this to every reported completion_tokens")
	fs.IntVar(&cfg.Faults.FailEvery, "fault-fail-every", 0, "fault: every Nth chat request answers HTTP 500")
	fs.IntVar(&cfg.Faults.DropStreamAfter, "fault-drop-stream-after", 0, "fault: cut streams after this many tokens")
	fs.BoolVar(&cfg.Faults.MalformedSSE, "fault-malformed-sse", false, "fault: one garbled SSE line mid-stream")
	fs.DurationVar(&cfg.Faults.NotReadyFor, "fault-not-ready-for", 0, "fault: /health answers 503 this long after start")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if kv != "" {
		for _, f := range strings.Split(kv, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return cfg, "", fmt.Errorf("--kv-tokens: %q is not a whole number of tokens", f)
			}
			cfg.KVTokens = append(cfg.KVTokens, n)
		}
	}
	return cfg, *listen, nil
}
