package collect

import (
	"slices"
	"sort"
	"strconv"
	"time"

	"heft/shared/wire"
)

// Significant reports whether next differs from prev in something a
// coordinator must hear about at once: an engine appearing, disappearing,
// turning ready or not, failing or recovering, changing model, version,
// capacity key, launch arguments, KV pools (and whether they are whole,
// and what the endpoints say of them) or GPUs, where its log is read from
// and whether it can be, a new passive or pace reading; the set of GPUs; the
// GPU error; the set of foreign processes; or a GPU starting or ending a
// slowdown (wire.SlowdownReasons), which the coordinator weighs at once.
// Clocks, temperatures, power, other clock event reasons (a power cap
// comes and goes under load), free memory, what an engine holds on its
// GPUs, and load are noise here: the periodic heartbeat carries them.
func Significant(prev, next wire.Snapshot) bool {
	if prev.Node != next.Node || prev.GPUError != next.GPUError {
		return true
	}
	if !slices.Equal(gpuIDs(prev.GPUs), gpuIDs(next.GPUs)) {
		return true
	}
	if !slices.Equal(foreignPIDs(prev.GPUs), foreignPIDs(next.GPUs)) {
		return true
	}
	if !slices.Equal(slowdowns(prev.GPUs), slowdowns(next.GPUs)) {
		return true
	}
	if len(prev.Engines) != len(next.Engines) {
		return true
	}
	before := map[string]wire.Engine{}
	for _, e := range prev.Engines {
		before[e.URL] = e
	}
	for _, n := range next.Engines {
		p, ok := before[n.URL]
		if !ok || engineChanged(p, n) {
			return true
		}
	}
	return false
}

func engineChanged(p, n wire.Engine) bool {
	return p.Kind != n.Kind || p.Ready != n.Ready || p.Error != n.Error || p.Model != n.Model ||
		p.Version != n.Version || p.CapacityKey != n.CapacityKey || p.PID != n.PID ||
		p.LaunchArgsSource != n.LaunchArgsSource || p.RanksSource != n.RanksSource ||
		!slices.Equal(p.LaunchArgs, n.LaunchArgs) || !slices.Equal(p.Ranks, n.Ranks) ||
		!slices.Equal(p.Models, n.Models) || !slices.Equal(p.GPUUUIDs, n.GPUUUIDs) ||
		!slices.Equal(procPIDs(p.ForeignProcesses), procPIDs(n.ForeignProcesses)) ||
		p.ExpectedRanks != n.ExpectedRanks || !sameBool(p.Complete, n.Complete) || !slices.Equal(p.MissingRanks, n.MissingRanks) ||
		!slices.Equal(checkRanks(p.PoolCheck), checkRanks(n.PoolCheck)) || logState(p.LogSource) != logState(n.LogSource) ||
		!passiveAt(p.Passive).Equal(passiveAt(n.Passive)) || !paceAt(p.Pace).Equal(paceAt(n.Pace))
}

// A passive or pace reading the coordinator has not seen is sent at once
// (one per window), not at the next heartbeat.
func passiveAt(r *wire.Passive) time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.At
}

func paceAt(r *wire.Pace) time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.At
}

func sameBool(a, b *bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func checkRanks(c *wire.PoolCheck) []wire.Rank {
	if c == nil {
		return nil
	}
	return c.Ranks
}

// logState is what of a log source's state matters at once: where it
// reads and whether it can; its line counts grow all the time and ride
// the heartbeat.
func logState(l *wire.LogSource) string {
	if l == nil {
		return ""
	}
	return l.Spec + "\x00" + l.Resolved + "\x00" + l.Via + "\x00" + l.Wrapper + "\x00" + l.Error
}

// gpuIDs identifies the GPU set by UUID (index when a UUID is missing) and
// whether each device could be read.
func gpuIDs(gpus []wire.GPU) []string {
	ids := make([]string, 0, len(gpus))
	for _, g := range gpus {
		id := g.UUID
		if id == "" {
			id = "#" + strconv.Itoa(g.Index)
		}
		if g.Error != "" {
			id += "!"
		}
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// foreignPIDs lists "uuid/pid" of every process marked foreign.
func foreignPIDs(gpus []wire.GPU) []string {
	var out []string
	for _, g := range gpus {
		for _, p := range g.Processes {
			if p.Foreign {
				out = append(out, g.UUID+"/"+strconv.Itoa(p.PID))
			}
		}
	}
	sort.Strings(out)
	return out
}

func procPIDs(ps []wire.GPUProcess) []int {
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.PID)
	}
	sort.Ints(out)
	return slices.Compact(out)
}

// slowdowns lists "uuid/reason" of every slowdown reason a GPU reports.
func slowdowns(gpus []wire.GPU) []string {
	var out []string
	for _, g := range gpus {
		for _, r := range wire.Slowdowns(g.ClockEventReasons) {
			out = append(out, g.UUID+"/"+r)
		}
	}
	sort.Strings(out)
	return out
}
