// Package bench is `make bench`: it measures, with the real binaries and
// libraries on loopback, how faithfully heft measures simulated workers,
// what a measurement costs, how accurate the weights are, how the
// coordinator scales with agents and how light the agent is. Each area
// prints one markdown table; Run returns them all as a Report.
//
// Speeds are never asserted: every ratio is measured side by side in one
// run and judged against its target in the table, with the verdict spelled
// out. See bench/README.md for what each area does and how to read it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"heft/agent/probe"

	"heft/sim"
)

// Areas, in the order they run.
const (
	AreaFidelity = 1
	AreaCold     = 2
	AreaCost     = 3
	AreaWeights  = 4
	AreaScale    = 5
	AreaAgent    = 6
	// AreaPrefill and AreaPrefillCost share their probes, as areas 1 and
	// 3 do.
	AreaPrefill     = 7
	AreaPrefillCost = 8
	AreaRouting     = 9
	AreaChaos       = 10
	AreaChanges     = 11
)

// AllAreas lists every area.
var AllAreas = []int{AreaFidelity, AreaCold, AreaCost, AreaWeights, AreaScale, AreaAgent, AreaPrefill, AreaPrefillCost, AreaRouting, AreaChaos, AreaChanges}

// Options configure a run.
type Options struct {
	// Quick runs a reduced version of every area (fewer, faster workers,
	// short bursts, 50 agents): it exercises the harness in seconds, and
	// its numbers are not the product's.
	Quick bool
	// Areas to run; empty = all.
	Areas []int
	// Bin is the folder with heft-agent, heft-coordinator, heft-sim,
	// heft-sync, swarm and heftbench (see Build).
	Bin string
	// Runs per cell; 0 = 3 (1 in quick mode).
	Runs int
	// Agents are the swarm sizes of area 5; empty = 1000, 5000, 10000
	// (50 in quick mode).
	Agents []int
	// LogBytes is how much the followed log grows in area 6; 0 = 1 GB
	// (20 MB in quick mode).
	LogBytes int64
	// AgentWindow is how long the agent's footprint is sampled; 0 = 60s
	// (3s in quick mode).
	AgentWindow time.Duration
	// RoutingSeeds is how many arrival schedules area 9 offers at each
	// load; 0 = 2 (1 in quick mode).
	RoutingSeeds int
	// RoutingCell is how long arrivals last in each of area 9's cells;
	// 0 = 30s (3s in quick mode).
	RoutingCell time.Duration
	// RoutingLoads are area 9's offered loads in percent of the fleet's
	// true capacity; empty = 30, 60, 90 (60 in quick mode).
	RoutingLoads []int
	// WeightMin is area 9's coordinator's weight_min, the smallest weight
	// it gives; 0 = the coordinator's default (0.25).
	WeightMin float64
	// ChangeCases are area 11's cases to run, by short name (slows,
	// restart, throttle, joins); empty = all.
	ChangeCases []string
	// ProbeBusy is area 11's agents' probe.busy: what a probe does with a
	// busy engine (wait, drain, passive-only); "" = wait, the default.
	ProbeBusy string
	// ChangeWindow is area 11's agents' passive and pace window
	// (probe.passive_window and probe.pace_window); 0 = the agents'
	// defaults (5s in quick mode).
	ChangeWindow time.Duration
	// PaceWindow is area 11's agents' pace window alone, over ChangeWindow.
	PaceWindow time.Duration
	// LateOracle, when above 0, has area 11 route each case and seed a
	// third time, by the true capacities set this long after the change.
	LateOracle time.Duration
	// SlowFactor is how many times slower area 11's fast worker becomes
	// in the slows, restart and throttle cases; 0 = 2 (half speed).
	SlowFactor float64
	// Keep leaves the work folder (every process's logs, configs and
	// state) in place and names it, to look into a run afterwards.
	Keep bool
	// Progress receives one line per step; nil = silent.
	Progress io.Writer
	// Out receives each area's section as soon as it is done; nil = none.
	Out io.Writer
}

// env is the state shared by the areas of one run.
type env struct {
	opts Options
	bin  string
	work string // scratch folder, removed at the end unless Options.Keep
	// fleets counts the routing fleets started: each gets folders of its
	// own, so no coordinator, agent or gateway state passes from one case
	// or seed to the next.
	fleets int
	runs   int
	tokens int // per request of every burst
	conc   int // requests per burst

	// Area 11's changes to the routing fleet: the fast worker's mid-run
	// throttle and the agents' passive window (0: the default).
	slowFast      sim.Slow
	fastListen    string // the fast sim's fixed address, so a restart keeps it ("" = any)
	joinListen    string // the joiner's address, known to the oracle's config before it joins ("" = no joiner)
	passiveWindow time.Duration
	paceWindow    time.Duration
	probeBusy     string       // the agents' probe.busy ("": their default)
	fastNVML      *standinNVML // the fast worker's agent reads its GPU here (nil: no GPU)

	fidelityOnce sync.Once
	fidelity     []workerRuns // area 1's probes, reused by area 3
	fidelityErr  error

	prefillOnce sync.Once
	prefill     []prefillWorker // area 7's probes, reused by area 8
	prefillErr  error
}

func (e *env) logf(format string, args ...any) {
	if e.opts.Progress != nil {
		fmt.Fprintf(e.opts.Progress, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// Run runs the selected areas and returns their report. An area that fails
// says so in its section; Run's error is for bad options only.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if len(opts.Areas) == 0 {
		opts.Areas = AllAreas
	}
	for _, a := range opts.Areas {
		if !slices.Contains(AllAreas, a) {
			return nil, fmt.Errorf("bench: unknown area %d (areas are 1 to %d)", a, len(AllAreas))
		}
	}
	if _, err := selectCases(opts.ChangeCases); err != nil {
		return nil, err
	}
	if opts.ProbeBusy != "" && !slices.Contains(probe.BusyModes, opts.ProbeBusy) {
		return nil, fmt.Errorf("bench: unknown probe busy mode %q (modes: %s)", opts.ProbeBusy, strings.Join(probe.BusyModes, ", "))
	}
	if f := opts.SlowFactor; f != 0 && !(f > 1 && f <= maxSlowFactor) {
		return nil, fmt.Errorf("bench: slow factor %v: want more than 1 and at most %v", f, maxSlowFactor)
	}
	for _, l := range opts.RoutingLoads {
		if l < 1 || l > 100 {
			return nil, fmt.Errorf("bench: routing load %d %%: want 1 to 100", l)
		}
	}
	if w := opts.WeightMin; w != 0 && !(w > 0 && w <= 1) {
		return nil, fmt.Errorf("bench: weight_min %v: want more than 0 and at most 1", w)
	}
	if opts.LateOracle < 0 {
		return nil, fmt.Errorf("bench: late oracle %s: want a delay of 0 or more", opts.LateOracle)
	}
	if opts.Bin == "" {
		return nil, errors.New("bench: no binaries folder (Options.Bin)")
	}
	bin, err := filepath.Abs(opts.Bin)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "heft-bench-")
	if err != nil {
		return nil, err
	}
	if opts.Keep && opts.Progress != nil {
		fmt.Fprintf(opts.Progress, "work folder kept: %s\n", work)
	}
	if !opts.Keep {
		defer os.RemoveAll(work)
	}

	e := &env{opts: opts, bin: bin, work: work, runs: opts.Runs, tokens: probe.DefaultTokens, conc: probe.DefaultConcurrency}
	mode := "full"
	if opts.Quick {
		mode = "quick (reduced: not the product's numbers)"
		e.tokens = 32
		if e.runs == 0 {
			e.runs = 1
		}
	}
	if e.runs <= 0 {
		e.runs = 3
	}
	mode += fmt.Sprintf("; %d run(s) per cell; burst %d × %d tokens", e.runs, e.conc, e.tokens)

	areas := slices.Clone(opts.Areas)
	slices.Sort(areas)
	areas = slices.Compact(areas)
	e.logf("running areas %v; estimated %s", areas, e.estimate(areas).Round(time.Second))

	start := time.Now()
	r := &Report{Header: machineHeader(ctx, mode)}
	write(opts.Out, r.Header.Markdown())
	for _, a := range areas {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		var s *Section
		switch a {
		case AreaFidelity:
			s = e.areaFidelity(ctx)
		case AreaCold:
			s = e.areaCold(ctx)
		case AreaCost:
			s = e.areaCost(ctx)
		case AreaWeights:
			s = e.areaWeights(ctx)
		case AreaScale:
			s = e.areaScale(ctx)
		case AreaAgent:
			s = e.areaAgent(ctx)
		case AreaPrefill:
			s = e.areaPrefill(ctx)
		case AreaPrefillCost:
			s = e.areaPrefillCost(ctx)
		case AreaRouting:
			s = e.areaRouting(ctx)
		case AreaChaos:
			s = e.areaChaos(ctx)
		case AreaChanges:
			s = e.areaChanges(ctx)
		}
		s.Area = a
		s.Elapsed = time.Since(t0)
		e.logf("area %d done in %s", a, s.Elapsed.Round(time.Second))
		r.Sections = append(r.Sections, s)
		write(opts.Out, s.Markdown())
	}
	r.Elapsed = time.Since(start)
	return r, ctx.Err()
}

// estimate is a rough forecast of how long the areas take, from the ideal
// burst times and the measured overheads of each step.
func (e *env) estimate(areas []int) time.Duration {
	sec := 0.0
	runs := float64(e.runs)
	for _, a := range areas {
		switch a {
		case AreaFidelity, AreaCost:
			if a == AreaCost && slices.Contains(areas, AreaFidelity) {
				continue // shares area 1's probes
			}
			for _, c := range e.workers() {
				sec += runs * (2*c.IdealBurstSeconds(c.Burst(e.conc), e.tokens) + 0.1)
			}
		case AreaCold:
			for _, c := range e.workers() {
				cold := c.ColdBurstSeconds(c.Burst(e.conc), e.tokens, e.coldOf(c), 0)
				sec += runs * (cold + 3*c.IdealBurstSeconds(c.Burst(e.conc), e.tokens) + 0.2)
			}
			if !e.opts.Quick {
				big := fidelityWorkers[3]
				sec += runs * (2*big.ColdBurstSeconds(big.Burst(e.conc), e.tokens, longCold, 0) + 2*big.IdealBurstSeconds(big.Burst(e.conc), e.tokens))
			}
		case AreaWeights:
			sec += runs * (2*weightWorkers[0].IdealBurstSeconds(weightWorkers[0].Burst(e.conc), e.tokens) + 6)
		case AreaScale:
			for _, n := range e.agentCounts() {
				sec += 25 + 5*float64(n)/1000
			}
		case AreaAgent:
			window, _ := e.agentParams()
			sec += window.Seconds() + 20
			if !e.opts.Quick {
				sec += 10 // a gigabyte of log
			}
		case AreaPrefill, AreaPrefillCost:
			if a == AreaPrefillCost && slices.Contains(areas, AreaPrefill) {
				continue // shares area 7's probes
			}
			cals, n, length := e.prefillSetup()
			for _, c := range cals {
				sec += runs * (2*c.IdealBurstSeconds(c.Burst(e.conc), e.tokens) + 0.1)
				if p, err := c.SimConfig("", Cold{}).IdealBurstSeconds(n, length, 1); err == nil {
					sec += runs * 2 * p
				}
			}
		case AreaRouting:
			sec += e.routingPlanFor().estimate().Seconds()
		case AreaChanges:
			sec += e.changesPlanFor().estimate().Seconds()
		case AreaChaos:
			sec += 60 // building and starting the rig
			if e.opts.Quick {
				sec += 90
			} else {
				sec += 6*90 + 4*60
			}
		}
	}
	return time.Duration(sec * float64(time.Second))
}
