package web_test

import (
	"testing"
	"time"

	"heft/shared/view"
	"heft/shared/wire"
)

const demoModel = "Qwen/Qwen3-8B"

// demo is the README's demo fleet, with the GPUs a real fleet would report:
// a fast vLLM worker that starts cold, a slower SGLang one, a Mac mlx one
// that cannot be told an exact length, and an SGLang worker whose two
// data-parallel ranks got uneven KV pools because a foreign process sat on
// the second GPU.
type demo struct {
	agents  map[string]*agent
	engines map[string]wire.Engine // by node
	snaps   map[string]wire.Snapshot
}

func (d *demo) id(node string) string { return d.engines[node].CapacityKey }

// startDemo connects the demo's agents to c and waits until every worker
// is measured. history adds that many earlier measurements per worker, for
// the chart.
func startDemo(t *testing.T, c *coordinator, history int) *demo {
	t.Helper()
	d := &demo{agents: map[string]*agent{}, engines: map[string]wire.Engine{}, snaps: map[string]wire.Snapshot{}}
	type spec struct {
		node   string
		eng    wire.Engine
		gpus   []wire.GPU
		tps    float64
		warmup float64
		// prefill is the prefill burst's prompt tok/s; 0 = no prefill part.
		prefill float64
		edit    func(*wire.Measurement)
		host    func(*wire.Host)
	}
	h100 := gpu(0, "NVIDIA H100 80GB HBM3", "GPU-5b1a0c3e-a", 79.6, 6.1, 1980, 1980)
	l40s := gpu(0, "NVIDIA L40S", "GPU-77c2e0d1-b", 44.4, 4.9, 2490, 2520)
	l4a := gpu(0, "NVIDIA L4", "GPU-0e3f9a52-d0", 22.0, 0.41, 2040, 2040)
	l4b := gpu(1, "NVIDIA L4", "GPU-91c4b7e8-d1", 22.0, 0.38, 1995, 2040)
	l4b.Processes = []wire.GPUProcess{
		{PID: 48213, Name: "python3", UsedMemory: 3400 << 20, Foreign: true},
		{PID: 48377, Name: "python3", UsedMemory: 3150 << 20, Foreign: true},
	}
	l4b.ClockEventReasons = []string{"sw_power_cap"}
	m4 := wire.GPU{Index: 0, UUID: "apple-m4-max", Name: "Apple M4 Max", MemoryTotal: 128 << 30, MemoryFree: 71 << 30,
		MemoryUsed: 57 << 30, SMClockMHz: 1578, SMClockMaxMHz: 1578, UtilizationPercent: 92}

	dp := engine("gpu-d", wire.EngineSGLang, demoModel, "0.5.3", 30000, "--dp-size=2", "--mem-fraction-static=0.88")
	dp.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	dp.RanksSource = "/var/log/sglang/server.log"
	dp.GPUUUIDs = []string{l4a.UUID, l4b.UUID}
	dp.MaxModelLen, dp.MaxModelLenSource = 40960, "v1_models" // more than its small rank holds
	fast := engine("gpu-a", wire.EngineVLLM, demoModel, "0.11.0", 8000, "--max-num-seqs=256")
	fast.MaxModelLen, fast.MaxModelLenSource = 40960, "v1_models"
	mid := engine("gpu-b", wire.EngineSGLang, demoModel, "0.5.3", 30000, "--mem-fraction-static=0.88")
	mid.MaxModelLen, mid.MaxModelLenSource = 32768, "v1_models"
	specs := []spec{
		{node: "gpu-a", eng: fast, gpus: []wire.GPU{h100}, tps: 1984, warmup: 551, prefill: 9800},
		{node: "gpu-b", eng: mid, gpus: []wire.GPU{l40s}, tps: 884, warmup: 861, prefill: 14200},
		{node: "mac-c", eng: engine("mac-c", wire.EngineMLX, demoModel, "0.28.1", 8080),
			gpus: []wire.GPU{m4}, tps: 296, warmup: 288,
			edit: func(m *wire.Measurement) {
				m.Complete, m.OutputTokens = false, 1931
				m.Problems = []string{"mlx-lm has no min_tokens: 3 of 16 responses stopped early at an end-of-sequence token"}
			},
			host: func(h *wire.Host) { h.OS, h.Arch, h.UnifiedMemory = "darwin", "arm64", true }},
		{node: "gpu-d", eng: dp, gpus: []wire.GPU{l4a, l4b}, tps: 613, warmup: 598, prefill: 7100},
	}
	now := time.Now()
	for _, s := range specs {
		a := dialAgent(t, c, s.node)
		var past []wire.Measurement
		for i := range history {
			// Earlier measurements, a little noisy, within the coordinator's
			// accepted clock skew.
			f := 1 + 0.04*float64((i*7)%5-2)
			m := measurement(s.node, s.eng, s.tps*f, s.warmup*f)
			m.FinishedAt = now.Add(-time.Duration(history-i) * 8 * time.Minute)
			m.StartedAt = m.FinishedAt.Add(-3 * time.Second)
			if s.edit != nil {
				s.edit(&m)
			}
			past = append(past, m)
		}
		a.before(s.eng.CapacityKey, past)
		m := measurement(s.node, s.eng, s.tps, s.warmup)
		if s.prefill > 0 {
			m.Prefill = &wire.Prefill{ThroughputTPS: s.prefill, WarmupTPS: s.prefill * 0.97, PromptTokens: 4 * 8192,
				ExpectedPromptTokens: 4 * 8192, WallSeconds: 4 * 8192 / s.prefill, PromptLength: 8192, Requests: 4, Concurrency: 4,
				TTFTP50: 2 * 8192 / s.prefill, TTFTP95: 4 * 8192 / s.prefill, TokenSource: "usage", Complete: true}
		}
		if s.edit != nil {
			s.edit(&m)
		}
		a.answer(m)
		host := testHost(s.node)
		if s.host != nil {
			s.host(&host)
		}
		snap := wire.Snapshot{Node: s.node, At: now, Host: host, GPUs: s.gpus, Engines: []wire.Engine{s.eng}}
		a.send(t, &snap)
		d.agents[s.node], d.engines[s.node], d.snaps[s.node] = a, s.eng, snap
	}
	// Each earlier measurement answers one request: the registration probe,
	// then on-demand probes an admin asks for.
	for n := 1; n <= history+1; n++ {
		c.waitWorkers(t, "the demo fleet measured", func(ws []view.Worker) bool {
			measured := 0
			for _, w := range ws {
				if w.MeasuredAt != nil && len(w.History) == n {
					measured++
				}
			}
			return measured == len(specs)
		})
		if n <= history {
			for _, e := range d.engines {
				c.probe(t, e.CapacityKey)
			}
		}
	}
	return d
}
