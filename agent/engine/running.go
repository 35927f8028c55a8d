package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"heft/agent/engine/proc"
	"heft/agent/enginelog"
	"heft/shared/wire"
)

// What an engine runs at once (wire.Engine.MaxRunning) comes, in order of
// trust, from the engine's own endpoints (the kind's adapter sets
// reading.running: SGLang's /v1/loads or /server_info, llama.cpp's
// /props), then from its launch arguments and the kind's default
// (descriptor.running), per data-parallel rank × ranks.

// runningInput is what a kind's running function reads.
type runningInput struct {
	// args are the normalised launch arguments as a map.
	args map[string]string
	// gpus are the engine's GPUs, when the agent could tell them.
	gpus []wire.GPU
	// env reads a variable of the engine process's environment: ok false
	// when it is not set, err when the environment cannot be read.
	env func(name string) (value string, ok bool, err error)
}

// Max-running sources, for wire.Engine.MaxRunningSource.
const (
	runningFromArgs    = "launch_args"
	runningFromDefault = "default"
	runningFromEnv     = "env"
)

// maxRunning decides e.MaxRunning and its source.
func (c *Client) maxRunning(ctx context.Context, r *reading, args []string, e wire.Engine, gpus []wire.GPU, pid int, lf *enginelog.Facts) (int, string) {
	if r.running > 0 {
		return min(r.running, wire.MaxRunning), r.runningSrc
	}
	if c.kind.running == nil {
		return 0, ""
	}
	in := runningInput{args: argMap(args), gpus: engineGPUs(gpus, e.GPUUUIDs), env: func(string) (string, bool, error) {
		return "", false, proc.ErrNoListener
	}}
	if pid > 0 {
		in.env = func(name string) (string, bool, error) { return proc.Getenv(ctx, pid, name) }
	}
	perRank, src := c.kind.running(in)
	if perRank <= 0 {
		return 0, ""
	}
	ranks := dpRanks(in.args, e, lf)
	if ranks > 1 {
		src = fmt.Sprintf("%s × %d ranks", src, ranks)
	}
	return min(perRank*ranks, wire.MaxRunning), bound(src)
}

// dpRanks is how many data-parallel ranks the engine runs: the most any
// fact says, at least 1.
func dpRanks(args map[string]string, e wire.Engine, lf *enginelog.Facts) int {
	n := max(1, len(e.Ranks), len(e.Load.Ranks))
	if v, err := strconv.Atoi(args["data_parallel_size"]); err == nil && v > 0 && v < wire.MaxRanks {
		n = max(n, v)
	}
	if lf != nil && lf.ExpectedRanks < wire.MaxRanks {
		n = max(n, lf.ExpectedRanks)
	}
	return n
}

// argMap turns normalised "key=value" launch arguments into a map.
func argMap(args []string) map[string]string {
	m := make(map[string]string, len(args))
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			m[k] = v
		}
	}
	return m
}

// engineGPUs are the GPUs among gpus that the engine uses.
func engineGPUs(gpus []wire.GPU, uuids []string) []wire.GPU {
	var out []wire.GPU
	for _, g := range gpus {
		for _, u := range uuids {
			if g.UUID == u {
				out = append(out, g)
			}
		}
	}
	return out
}

// positiveArg reads a launch argument that is a positive count; src
// names it ("launch_args max_num_seqs=16").
func positiveArg(args map[string]string, key string) (int, string, bool) {
	v, err := strconv.Atoi(args[key])
	if err != nil || v <= 0 || v > wire.MaxRunning {
		return 0, "", false
	}
	return v, fmt.Sprintf("%s %s=%d", runningFromArgs, key, v), true
}
