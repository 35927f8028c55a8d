package engine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/agent/engine/launch"
	"heft/agent/engine/proc"
	"heft/agent/enginelog"
	"heft/shared/wire"
)

// Facts reads everything the agent reports about the engine. It never
// fails: problems go in Engine.Error. gpus are this host's GPUs (their
// processes decide GPUUUIDs and ForeignProcesses); logFacts, when not
// nil, are what the engine's start-up log said.
func (c *Client) Facts(ctx context.Context, gpus []wire.GPU, logFacts *enginelog.Facts) wire.Engine {
	e := wire.Engine{Kind: c.kind.name, URL: c.url}
	r := c.read(ctx)

	// The engine's processes, when it runs on this host.
	var tree []int
	var pid int
	var cmdArgs map[string]string
	if r.down && c.procs != nil {
		c.procs.Forget()
	}
	if c.local {
		p, err := c.findProcess(ctx)
		switch {
		case err == nil:
			e.PID, tree, pid = p.Root, p.Tree, p.Root
			if looksLikeEngine(p.Argv) {
				cmdArgs = launch.FromCmdline(p.Argv)
			}
		case errors.Is(err, proc.ErrNoListener):
			c.logger.Debug("engine process not found", "port", c.port)
		default:
			c.warnOnce(err.Error(), "cannot find the engine's process", "error", err)
		}
	}

	// Launch arguments: command line, then the log, then what the engine serves.
	var args []string
	switch {
	case len(cmdArgs) > 0:
		args, e.LaunchArgsSource = launch.Normalize(cmdArgs), SourceCmdline
	case logFacts != nil && len(logFacts.LaunchArgs) > 0:
		args, e.LaunchArgsSource = launch.Normalize(logFacts.LaunchArgs), SourceLog
	case len(r.args) > 0:
		args, e.LaunchArgsSource = launch.Normalize(r.args), r.argsSrc
	}
	args, e.LaunchArgsSource = c.stickyArgs(args, e.LaunchArgsSource, r.down)

	e.Models = r.models
	e.Ready = r.ready && !r.down
	e.Version = r.version
	if e.Version == "" && logFacts != nil {
		e.Version = bound(logFacts.Version)
	}
	e.Load = r.load
	e.Model = c.pickModel(r, cmdArgs, logFacts, args)
	e.Ranks, e.RanksSource = c.pickRanks(r, logFacts)
	e.MaxModelLen, e.MaxModelLenSource = c.pickMaxModelLen(r, e.Model, args, e.LaunchArgsSource)
	if len(e.Ranks) > 0 {
		e.RanksAt = time.Now().UTC()
	}
	if len(e.Ranks) > 0 && e.RanksSource != r.poolsSrc && len(r.pools) > 0 && r.poolsSrc != SourceAPIPS {
		// The log's pools won; what the endpoints said checks them. Not
		// Ollama's /api/ps: its context_length is one request's context,
		// while the runner's cache in the log holds OLLAMA_NUM_PARALLEL
		// of them, so the two differ without either being wrong.
		e.PoolCheck = &wire.PoolCheck{Source: r.poolsSrc, Ranks: slices.Clone(r.pools)}
	}
	completeness(&e, logFacts, args)
	// A log that shows a restart's banner and not yet its launch args has
	// the follower between two lines: a key now would name a launch
	// without arguments that never ran, and the coordinator would spend a
	// burst on it. Without a key the coordinator keeps the worker it knows
	// at this URL, routed as it was; the next snapshot has the real key.
	argsPending := logFacts != nil && logFacts.BannerOnly && e.LaunchArgsSource == ""
	if e.Model != "" && !argsPending {
		e.CapacityKey = launch.CapacityKey(c.cfg.Node, c.kind.name, e.Model, args)
	}
	e.LaunchArgs = boundList(args)
	e.GPUUUIDs, e.ForeignProcesses, e.GPUMemory = gpuUse(gpus, tree)
	c.advertised(ctx, &e, r.down)
	e.MaxRunning, e.MaxRunningSource = c.maxRunning(ctx, r, args, e, gpus, pid, logFacts)
	if len(r.problems) > 0 {
		e.Error = bound(strings.Join(r.problems, "; "))
	}
	return e
}

// pickModel chooses the served model: the configured override, then what
// the engine says it has loaded (for mlx-lm, its --model argument), then
// its model list, then the log, then the launch arguments.
func (c *Client) pickModel(r *reading, cmdArgs map[string]string, lf *enginelog.Facts, args []string) string {
	candidates := []string{c.cfg.Model, r.served}
	if c.kind.modelFromCmdline {
		candidates = append(candidates, cmdArgs["model"])
	}
	if len(r.models) > 0 {
		candidates = append(candidates, r.models[0])
	}
	if lf != nil {
		candidates = append(candidates, lf.Model)
	}
	for _, key := range []string{"served_model_name", "model"} {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, key+"="); ok {
				candidates = append(candidates, v)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	candidates = append(candidates, c.lastModel)
	for _, m := range candidates {
		if m = strings.TrimSpace(m); m != "" {
			c.lastModel = bound(m)
			return c.lastModel
		}
	}
	return ""
}

// pickRanks chooses the KV pools per rank: the start-up log's, the most
// truthful source, then what the kind's endpoints said (each kind's
// adapter picks among its own endpoints).
func (c *Client) pickRanks(r *reading, lf *enginelog.Facts) ([]wire.Rank, string) {
	if lf != nil && len(lf.Ranks) > 0 && wire.CheckRanks(lf.Ranks) == nil {
		ranks := slices.Clone(lf.Ranks)
		slices.SortFunc(ranks, func(a, b wire.Rank) int { return a.DPRank - b.DPRank })
		src := c.cfg.Log
		if src == "" {
			src = SourceLog
		}
		return ranks, bound(src)
	}
	return r.pools, r.poolsSrc
}

// completeness sets how many data-parallel ranks the engine runs (the
// most that its launch arguments, its log or its pools show) and which of
// them have no pool. It says nothing when none of those shows a rank.
func completeness(e *wire.Engine, lf *enginelog.Facts, args []string) {
	expected := 0
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "data_parallel_size="); ok {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				expected = n
			}
		}
	}
	if lf != nil {
		expected = max(expected, lf.ExpectedRanks)
	}
	have := make(map[int]bool, len(e.Ranks))
	for _, r := range e.Ranks {
		have[r.DPRank] = true
		expected = max(expected, r.DPRank+1)
	}
	expected = min(expected, wire.MaxRanks)
	if expected == 0 {
		return
	}
	var missing []int
	for dp := range expected {
		if !have[dp] {
			missing = append(missing, dp)
		}
	}
	// A log that cannot show how many ranks there are never makes the set
	// complete: the wire has no "unknown", and nil reads as complete.
	complete := len(e.Ranks) > 0 && len(missing) == 0 && (lf == nil || lf.RankCountUnknown == "")
	e.ExpectedRanks, e.Complete, e.MissingRanks = expected, &complete, missing
}

// pickMaxModelLen chooses the maximum model length: what the engine serves
// in /v1/models for the model (the length it runs with), then what its
// own endpoints state, then the launch argument that sets it.
func (c *Client) pickMaxModelLen(r *reading, model string, args []string, argsSrc string) (int64, string) {
	if n := r.modelLens[model]; c.kind.context.models && n > 0 {
		return n, SourceModels
	}
	if r.maxModelLen > 0 {
		return r.maxModelLen, r.maxModelLenSrc
	}
	for _, key := range c.kind.context.args {
		for _, a := range args {
			v, ok := strings.CutPrefix(a, key+"=")
			if !ok {
				continue
			}
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n <= maxKVTokens {
				return n, argsSrc
			}
		}
	}
	return 0, ""
}

// stickyArgs keeps the command-line arguments of the last read while the
// engine is down and its process gone: the log or /server_info would give
// another set, and so another capacity key, for the same engine during a
// short outage.
func (c *Client) stickyArgs(args []string, src string, down bool) ([]string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if down && src != SourceCmdline && c.lastSrc == SourceCmdline {
		return c.lastArgs, c.lastSrc
	}
	if src != "" {
		c.lastArgs, c.lastSrc = args, src
	}
	return args, src
}

// gpuUse returns the GPUs on which a process of tree holds memory, the
// processes on those GPUs that are outside tree, and what tree holds on
// each of those GPUs.
func gpuUse(gpus []wire.GPU, tree []int) ([]string, []wire.GPUProcess, []wire.GPUMemory) {
	if len(tree) == 0 {
		return nil, nil, nil
	}
	in := make(map[int]bool, len(tree))
	for _, pid := range tree {
		in[pid] = true
	}
	var uuids []string
	var foreign []wire.GPUProcess
	var held []wire.GPUMemory
	for _, g := range gpus {
		mine := slices.ContainsFunc(g.Processes, func(p wire.GPUProcess) bool { return in[p.PID] })
		if !mine || g.UUID == "" || slices.Contains(uuids, g.UUID) {
			continue
		}
		var sum uint64
		for _, p := range g.Processes {
			switch {
			case in[p.PID]:
				sum += p.UsedMemory
			case len(foreign) < wire.MaxProcesses:
				p.Foreign = true
				foreign = append(foreign, p)
			}
		}
		if len(uuids) < wire.MaxListItems {
			uuids = append(uuids, g.UUID)
			held = append(held, wire.GPUMemory{UUID: g.UUID, UsedBytes: sum})
		}
	}
	return uuids, foreign, held
}

// boundList cuts a list to what the wire accepts. The capacity key is
// computed over the whole list before this.
func boundList(list []string) []string {
	if len(list) > wire.MaxListItems {
		list = list[:wire.MaxListItems]
	}
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, bound(s))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
