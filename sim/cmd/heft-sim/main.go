// Command heft-sim runs a simulated inference engine until SIGINT or
// SIGTERM and prints its URL on stdout. See package heft/sim for the model.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"heft/shared/settings"
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
	cfg, listen, code, ok := parseFlags(args, stdout, stderr)
	if !ok {
		return code
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

// usageHead is the top of -h: what the sim is and its step model.
const usageHead = `heft-sim runs a simulated inference engine and prints its URL.

Step model, per data-parallel rank (requests are dealt round-robin):
  A step has a budget of --max-batched-tokens tokens. Decoding sequences
  take one token each; the rest goes to prompt chunks, oldest first (sglang
  and mlx run prompt chunks in steps of their own while decoding waits). A
  sequence whose last prompt chunk is in a step samples its first token in
  it. A step that gives b sequences a token and prefills p prompt tokens
  takes
      (t0 + k*b, if b > 0) + p/P  seconds,  x F while cold,
  with t0 + k = 1/S1, t0 + 16k = 16/S16 (S1 --single-tps, S16
  --batch16-tps, P --prefill-tps, F --cold-factor). Without --prefill-tps
  prefill is free: only decode steps cost time. So one long
  prompt of L tokens and one output token takes L/P + 1/S1 seconds, and n of
  them with L >= the budget take n*(L/P + 1/S1) on one rank.
  Prompt and generated tokens hold the rank's --kv-tokens pool; admission
  sets aside prompt + max tokens, and requests that do not fit wait in FIFO.
Tokens: a whitespace-separated word of up to 8 bytes is one token (longer:
  one per 8 bytes); a chat prompt adds 4 per message and 2, so one user
  message of W short words is W + 6 tokens.

Flags:
`

// parseFlags reads the command line; when ok is false the program ends
// with code: help and --version print on stdout (0), a mistake prints on
// stderr with the usage (2), as on every heft binary.
func parseFlags(args []string, stdout, stderr io.Writer) (cfg sim.Config, listen string, code int, ok bool) {
	var kv, logKV string
	fs := flag.NewFlagSet("heft-sim", flag.ContinueOnError)
	usage := func(w io.Writer) {
		fmt.Fprint(w, usageHead)
		settings.PrintFlags(w, fs)
	}
	fs.Bool("version", false, "print heft-sim's version and exit")
	fs.StringVar(&cfg.Flavor, "flavor", sim.FlavorVLLM, "engine to imitate: "+strings.Join(sim.Flavors, "|"))
	fs.StringVar(&listen, "listen", "127.0.0.1:0", "`address` to listen on (port 0 = any free port)")
	fs.StringVar(&cfg.Model, "model", sim.DefaultModel, "served model name")
	fs.StringVar(&cfg.Version, "engine-version", "", "engine version to report (default: per flavour)")
	fs.Float64Var(&cfg.SingleTPS, "single-tps", 0, "tok/s of one request alone (required)")
	fs.Float64Var(&cfg.Batch16TPS, "batch16-tps", 0, "total tok/s of 16 concurrent requests, per rank (required)")
	fs.IntVar(&cfg.DP, "dp", 1, "data-parallel ranks (vllm, sglang)")
	fs.StringVar(&kv, "kv-tokens", "", "KV pool per rank in tokens, comma-separated, one value or one per rank (default 100000)")
	fs.Float64Var(&cfg.PrefillTPS, "prefill-tps", 0, "prompt tok/s of one rank prefilling alone (default 0: prefill is free)")
	fs.IntVar(&cfg.MaxBatchedTokens, "max-batched-tokens", 0, "tokens per step per rank (default: per flavour; vllm, sglang, mlx, llamacpp 2048, ollama 512)")
	fs.Int64Var(&cfg.MaxModelLen, "max-model-len", 0, "vllm max_model_len or sglang context_length (default 40960; vllm: at most the smallest pool)")
	fs.BoolVar(&cfg.NoPrefixCache, "no-prefix-cache", false, "turn the prefix cache off")
	fs.BoolVar(&cfg.ReportCachedTokens, "report-cached-tokens", false, "report usage.prompt_tokens_details.cached_tokens (vllm, sglang)")
	fs.Float64Var(&cfg.ColdFactor, "cold-factor", 1, "steps are this many times slower while cold")
	fs.Float64Var(&cfg.ColdSeconds, "cold-seconds", 0, "how long the engine stays cold after start")
	fs.DurationVar(&cfg.Slow.At, "slow-at", 0, "from this long after start, steps are --slow-factor times slower (a mid-run throttle; 0 with a factor: slow from the start)")
	fs.Float64Var(&cfg.Slow.Factor, "slow-factor", 1, "how many times slower steps are from --slow-at on (2: half speed); without it, HEFT_SIM_SLOW_FACTOR in the environment slows every step from the start with the same command line")
	fs.StringVar(&cfg.LogPath, "log", "", "write the engine's start-up log to this file")
	fs.StringVar(&cfg.LogNaming, "log-naming", "", "how the log names ranks: \"\" (newest), enginecore-n (vllm 0.8.3-0.10.1), dp-attention (sglang: only DP0 prints its pool), router (sglang_router workers: TP0 tags only)")
	fs.IntVar(&cfg.MultiNode.Size, "data-parallel-size", 0, "vllm multi-node: the deployment's DP size; --dp is this node's local ranks (0: one node)")
	fs.IntVar(&cfg.MultiNode.StartRank, "data-parallel-start-rank", 0, "vllm multi-node: this node's first DP rank")
	fs.StringVar(&cfg.MultiNode.Address, "data-parallel-address", "", "vllm multi-node: the head node's data-parallel address")
	fs.IntVar(&cfg.MultiNode.RPCPort, "data-parallel-rpc-port", 0, "vllm multi-node: the head node's data-parallel RPC port")
	fs.BoolVar(&cfg.MultiNode.Headless, "headless", false, "vllm multi-node: a node without the API server (logged as such; the sim still serves HTTP)")
	fs.IntVar(&cfg.PromptTokens, "prompt-tokens", 0, "tokens of every prompt, whatever its text (default: counted from its words)")
	fs.IntVar(&cfg.MaxRunning, "max-running", 0, "running sequences per rank (default: per flavour)")
	fs.IntVar(&cfg.SpecAccept, "spec-accept", 0, "speculative decoding: tokens each decode step gives a request, streamed as one chunk (0 or 1: one)")
	fs.IntVar(&cfg.DecodeLogInterval, "decode-log-interval", 0, "sglang: its scheduler writes its load gauges on each prefill batch and every N decode steps (0: SGLang's 40), and every 30 s while idle")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed for natural response lengths")
	fs.BoolVar(&cfg.Faults.IgnoreMinTokens, "fault-ignore-min-tokens", false, "fault: ignore min_tokens and ignore_eos")
	fs.IntVar(&cfg.Faults.UsageExtra, "fault-usage-extra", 0, "fault: add this to every reported completion_tokens")
	fs.IntVar(&cfg.Faults.FailEvery, "fault-fail-every", 0, "fault: every Nth chat request answers HTTP 500")
	fs.IntVar(&cfg.Faults.DropStreamAfter, "fault-drop-stream-after", 0, "fault: cut streams after this many tokens")
	fs.BoolVar(&cfg.Faults.MalformedSSE, "fault-malformed-sse", false, "fault: one garbled SSE line mid-stream")
	fs.DurationVar(&cfg.Faults.NotReadyFor, "fault-not-ready-for", 0, "fault: /health answers 503 this long after start")
	fs.IntVar(&cfg.Faults.TruncatePrompt, "fault-truncate-prompt", 0, "fault: silently keep only the first N prompt tokens (usage says N)")
	fs.IntVar(&cfg.Faults.PromptUsageExtra, "fault-prompt-usage-extra", 0, "fault: add this to every reported prompt_tokens")
	fs.BoolVar(&cfg.Faults.PrefillCached, "fault-prefill-cached", false, "fault: serve every prompt as if cached (no prefill time)")
	fs.BoolVar(&cfg.Faults.StaleGaugesOnAbort, "fault-stale-gauges-on-abort", false, "fault (vllm): the load gauges are written when a step ends, so requests all aborted at once stay on them until the next step")
	fs.IntVar(&cfg.Faults.RejectLong, "fault-reject-long", 0, "fault: reject prompts above N tokens with the flavour's context-length error")
	fs.StringVar(&logKV, "fault-log-kv-tokens", "", "fault: the start-up log prints these pools (comma-separated, as --kv-tokens) while the metrics keep the real ones")
	if code, ok := settings.ParseFlags(fs, args, usage, stdout, stderr); !ok {
		return cfg, "", code, false
	}
	for _, list := range []struct {
		flag, text string
		into       *[]int64
	}{{"kv-tokens", kv, &cfg.KVTokens}, {"fault-log-kv-tokens", logKV, &cfg.Faults.LogKVTokens}} {
		if list.text == "" {
			continue
		}
		for _, f := range strings.Split(list.text, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
			if err != nil {
				fmt.Fprintf(stderr, "heft-sim: --%s: %q is not a whole number of tokens\n\n", list.flag, f)
				usage(stderr)
				return cfg, "", settings.ExitUsage, false
			}
			*list.into = append(*list.into, n)
		}
	}
	// An engine restarted slower with the same launch arguments (another
	// GPU clock state, a neighbour on the card): the throttle comes from
	// the environment, so the command line the agent reads stays the same.
	if v := os.Getenv("HEFT_SIM_SLOW_FACTOR"); v != "" && cfg.Slow.Factor == 1 {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			fmt.Fprintf(stderr, "heft-sim: HEFT_SIM_SLOW_FACTOR=%q is not a number\n", v)
			return cfg, "", settings.ExitUsage, false
		}
		cfg.Slow = sim.Slow{Factor: f} // from the start; Start checks it
	}
	if err := checkFlags(cfg); err != nil {
		fmt.Fprintf(stderr, "heft-sim: %v\n\n", err)
		usage(stderr)
		return cfg, "", settings.ExitUsage, false
	}
	return cfg, listen, 0, true
}

// checkFlags finds the bad flag values of cfg, a usage error (2) as on
// every heft binary: --single-tps and --batch16-tps missing or not a
// positive number, and every value sim.Start would refuse besides the two
// calibration numbers together. What is left for Start to refuse (1) is a
// calibration it cannot simulate (--batch16-tps below --single-tps, or 16
// times it or more), a port in use, a log it cannot write.
func checkFlags(cfg sim.Config) error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"single-tps", cfg.SingleTPS}, {"batch16-tps", cfg.Batch16TPS}} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("--%s is required: a positive number of tok/s, got %v", f.name, f.v))
		}
	}
	// The calibration is the only part of the config that reads
	// SingleTPS and Batch16TPS: with one the sim can always simulate, an
	// error is some other flag's. IdealBurstSeconds validates the config
	// as Start does, without listening.
	probe := cfg
	probe.SingleTPS, probe.Batch16TPS = 100, 1000
	if _, err := probe.IdealBurstSeconds(1, 1, 1); err != nil && strings.HasPrefix(err.Error(), "sim config: ") {
		errs = append(errs, errors.New(strings.TrimPrefix(err.Error(), "sim config: ")))
	}
	return errors.Join(errs...)
}
