// Package metrics is heft-agent's Prometheus exposition: the agent's link
// to the coordinator, its GPUs, and each engine's basics, as named in
// packaging/prometheus/metrics.yml (`agent:`). Nothing is kept here: a
// scrape asks for the agent's State and turns it into constant metrics,
// on a private registry (no Go or process collectors: the agent's own
// lines only).
package metrics

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"heft/agent/gpu"
	"heft/shared/wire"
)

// State is what the agent knows at a scrape.
type State struct {
	Node      string
	Version   string
	Connected bool // the coordinator welcomed this agent, and the link is up
	// GPUs are the newest read of this host's GPUs.
	GPUs    []wire.GPU
	Engines []Engine
}

// Engine is one configured engine's basics.
type Engine struct {
	Kind string
	URL  string
	// Up: the last read found it answering and ready.
	Up bool
	// Log is the start-up log's spec, "" for none; LogLines counts its
	// lines read.
	Log      string
	LogLines int64
	// Probes counts the probes run here by Outcome*.
	Probes map[string]int64
}

// Probe outcomes, the values of heft_agent_probes_total's outcome label:
// a valid measurement, a measurement whose failure code says why it is
// not valid (wire.CodeEngineUnreachable, CodeProbeFailed,
// CodeProbeIncompleteOutput), a scheduled probe put off because the
// engine was busy, or a probe that could not run at all.
const (
	OutcomeMeasured = "measured"
	OutcomeBusy     = "deferred_busy"
	OutcomeError    = "error"
)

// Outcomes lists every outcome, each exported from the start (at 0) so
// that rates and increases work from the first probe.
var Outcomes = []string{OutcomeMeasured, wire.CodeEngineUnreachable, wire.CodeProbeFailed,
	wire.CodeProbeIncompleteOutput, OutcomeBusy, OutcomeError}

// Handler serves the exposition of read's State.
func Handler(read func() State, logger hclog.Logger) http.Handler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	reg := NewRegistry(read)
	// Without HandlerOpts.Registry: the handler's own error counter
	// would be the one line not listed in metrics.yml.
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}),
	})
}

// NewRegistry returns a registry holding only the agent's collector.
func NewRegistry(read func() State) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(read))
	return reg
}

type collector struct {
	read func() State

	build, connected                  *prometheus.Desc
	smClock, smClockMax, utilization  *prometheus.Desc
	clockReason, memFree, memTotal    *prometheus.Desc
	engineUp, logLines, probesByEvent *prometheus.Desc
}

func newCollector(read func() State) *collector {
	gpuLabels := []string{"node", "gpu", "uuid"}
	engineLabels := []string{"node", "kind", "url"}
	return &collector{
		read:       read,
		build:      prometheus.NewDesc("heft_agent_build_info", "1, with the agent's version as a label.", []string{"node", "version"}, nil),
		connected:  prometheus.NewDesc("heft_agent_coordinator_connected", "1 while the agent's websocket to the coordinator is up (after the welcome), else 0.", []string{"node"}, nil),
		smClock:    prometheus.NewDesc("heft_gpu_sm_clock_hertz", "Current SM clock.", gpuLabels, nil),
		smClockMax: prometheus.NewDesc("heft_gpu_sm_clock_max_hertz", "Maximum SM clock.", gpuLabels, nil),
		utilization: prometheus.NewDesc("heft_gpu_utilization_ratio",
			"Share of the last sample period in which a kernel ran, 0 to 1.", gpuLabels, nil),
		clockReason: prometheus.NewDesc("heft_gpu_clock_event_reason",
			"1 for each clock event (throttle) reason active now, 0 for each other one, by the agent's word for it.",
			append(gpuLabels, "reason"), nil),
		memFree:  prometheus.NewDesc("heft_gpu_memory_free_bytes", "Free GPU memory.", gpuLabels, nil),
		memTotal: prometheus.NewDesc("heft_gpu_memory_total_bytes", "Total GPU memory.", gpuLabels, nil),
		engineUp: prometheus.NewDesc("heft_agent_engine_up",
			"1 when the agent's last read of the engine found it answering and ready, else 0.", engineLabels, nil),
		logLines: prometheus.NewDesc("heft_agent_engine_log_lines_total",
			"Lines of the engine's start-up log read since the agent started (engines with a log only).", append(engineLabels, "log"), nil),
		probesByEvent: prometheus.NewDesc("heft_agent_probes_total",
			"Probes of the engine run by this agent since it started, by outcome: measured, a failure code, deferred_busy, or error.",
			append(engineLabels, "outcome"), nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.build, c.connected, c.smClock, c.smClockMax, c.utilization,
		c.clockReason, c.memFree, c.memTotal, c.engineUp, c.logLines, c.probesByEvent} {
		ch <- d
	}
}

// allReasons are the clock event reason words NVML defines: what a mask
// with every bit set decodes to, less the word for undefined bits.
var allReasons = slices.DeleteFunc(gpu.DecodeClockEventReasons(^uint64(0)), func(w string) bool {
	return strings.HasPrefix(w, "unknown_")
})

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.read()
	// A label value must be UTF-8, and a series that is not would stop
	// the whole scrape there (the collector panics, promhttp recovers):
	// a log path found through /proc can be any bytes.
	metric := func(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
		for i, l := range labels {
			labels[i] = strings.ToValidUTF8(l, "\uFFFD")
		}
		ch <- prometheus.MustNewConstMetric(d, kind, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) { metric(d, prometheus.GaugeValue, v, labels...) }
	gauge(c.build, 1, s.Node, s.Version)
	gauge(c.connected, boolValue(s.Connected), s.Node)

	for _, g := range s.GPUs {
		labels := []string{s.Node, strconv.Itoa(g.Index), g.UUID}
		// Zero is "not read" for clocks and memory. Utilisation and clock
		// reasons have a real zero (idle, no reason), so they are left out
		// where the device refused them or any read of it failed (a lost
		// GPU stops answering half way).
		has := func(field string) bool { return g.Error == "" && !slices.Contains(g.Unsupported, field) }
		const mhz = 1e6
		if g.SMClockMHz > 0 {
			gauge(c.smClock, float64(g.SMClockMHz)*mhz, labels...)
		}
		if g.SMClockMaxMHz > 0 {
			gauge(c.smClockMax, float64(g.SMClockMaxMHz)*mhz, labels...)
		}
		if has("utilization_percent") {
			gauge(c.utilization, g.UtilizationPercent/100, labels...)
		}
		if g.MemoryTotal > 0 {
			gauge(c.memFree, float64(g.MemoryFree), labels...)
			gauge(c.memTotal, float64(g.MemoryTotal), labels...)
		}
		if has("clock_event_reasons") {
			reasons := allReasons
			for _, r := range g.ClockEventReasons {
				if !slices.Contains(reasons, r) {
					reasons = append(slices.Clone(reasons), r) // a bit NVML did not define when heft was built
				}
			}
			for _, r := range reasons {
				gauge(c.clockReason, boolValue(slices.Contains(g.ClockEventReasons, r)), append(labels, r)...)
			}
		}
	}

	for _, e := range s.Engines {
		labels := []string{s.Node, e.Kind, e.URL}
		gauge(c.engineUp, boolValue(e.Up), labels...)
		if e.Log != "" {
			metric(c.logLines, prometheus.CounterValue, float64(e.LogLines), append(slices.Clone(labels), e.Log)...)
		}
		for _, o := range Outcomes {
			metric(c.probesByEvent, prometheus.CounterValue, float64(e.Probes[o]), append(slices.Clone(labels), o)...)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
