package server

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/health"
	"heft/shared/version"
	"heft/shared/view"
	"heft/shared/wire"
)

// metrics holds the server's own counters on a private registry; the
// fleet's state is read at scrape time by fleetCollector.
type metrics struct {
	reg          *prometheus.Registry
	handler      http.Handler
	messages     *prometheus.CounterVec
	disconnects  *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	authLimited  prometheus.Counter
	nodeRefusals *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_agent_messages_total", Help: "Valid messages received from agents, by type.",
		}, []string{"type"}),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_agent_disconnects_total", Help: "Agent connections ended, by reason.",
		}, []string{"reason"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_auth_failures_total", Help: "Requests refused for a missing or wrong token, by the token wanted.",
		}, []string{"kind"}),
		authLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "heft_auth_rate_limited_total", Help: "Requests refused with 429 after too many failed authentications from their source.",
		}),
		nodeRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_node_refusals_total", Help: "Agent connections refused after their hello: the node credential was missing or wrong, the node is pending or rejected, a limit was reached.",
		}, []string{"reason"}),
	}
	for _, l := range nodes.Labels {
		m.nodeRefusals.WithLabelValues(l)
	}
	// Known label values start at zero so rates work from the first scrape.
	for _, t := range []string{wire.TypeHello, wire.TypeSnapshot, wire.TypeProbeResult, wire.TypeProbeStatus} {
		m.messages.WithLabelValues(t)
	}
	for _, r := range dropReasons {
		m.disconnects.WithLabelValues(r)
	}
	for _, k := range []string{authAgent, authAdmin, authViewer} {
		m.authFailures.WithLabelValues(k)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.messages, m.disconnects, m.authFailures, m.authLimited, m.nodeRefusals, newTrustCollector(s),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "heft_agents_connected", Help: "Agents connected now (after their hello).",
		}, func() float64 { return float64(s.hub.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "heft_build_info", Help: "The coordinator's version, as a label.",
			ConstLabels: prometheus.Labels{"version": version.Version},
		}, func() float64 { return 1 }),
		newFleetCollector(s.fleet),
	)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:      m.reg,
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      s.log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}),
	})
	return m
}

// fleetCollector turns the fleet's workers into gauges at scrape time, so
// a forgotten worker's series go with it and an offline one says so at the
// next scrape. Per-worker series carry the labels id, model and node, as
// GET /api/v1/workers shows them.
type fleetCollector struct {
	fleet       fleetAPI
	weight      *prometheus.Desc
	state       *prometheus.Desc
	throughput  *prometheus.Desc
	measuredAt  *prometheus.Desc
	pool        *prometheus.Desc
	poolBalance *prometheus.Desc
	warning     *prometheus.Desc
	workers     *prometheus.Desc
	warnings    *prometheus.Desc
	probes      *prometheus.Desc
	handedOver  *prometheus.Desc
	capacity    capacityDescs // metrics_capacity.go
}

func newFleetCollector(f fleetAPI) *fleetCollector {
	worker := []string{"id", "model", "node"}
	with := func(extra ...string) []string { return append(slices.Clone(worker), extra...) }
	return &fleetCollector{
		fleet:    f,
		capacity: newCapacityDescs(),
		weight: prometheus.NewDesc("heft_worker_weight",
			"Routing weight of an admitted worker: its throughput over the median of its model's admitted workers, "+
				"clamped to [weight_min, weight_max], or the pinned weight; a stale worker keeps its last one. "+
				"Absent while the worker is not admitted or stale.", worker, nil),
		state: prometheus.NewDesc("heft_worker_state",
			"1 for the worker's state and 0 for each other one (pending, measuring, admitted, stale, held, offline). "+
				"Once the agent has been away for offline_grace: stale (still routed at its last weight) until stale_weight_ttl "+
				"after the disconnect, or offline when its agent last said the engine was down; gone when the worker is forgotten.", with("state"), nil),
		throughput: prometheus.NewDesc("heft_worker_throughput_tokens_per_second",
			"Output tokens per second of the worker's newest measurement (the standard burst: 16 concurrent requests "+
				"of 128 tokens, second pass). Absent when that measurement is not valid and while the worker is offline or stale.", worker, nil),
		measuredAt: prometheus.NewDesc("heft_worker_last_measured_timestamp_seconds",
			"When the worker's newest valid measurement finished, in Unix seconds; time() minus it is the measurement's age. "+
				"Absent until the worker has one.", worker, nil),
		pool: prometheus.NewDesc("heft_worker_kv_pool_tokens",
			"KV cache pool of each data-parallel rank in tokens, as the agent read it from the engine's start-up log. "+
				"Absent while the worker is offline or its pools are unknown.", with("dp_rank"), nil),
		poolBalance: prometheus.NewDesc("heft_worker_kv_pool_balance_ratio",
			"Smallest data-parallel rank's KV pool over the largest's (1 = even, and 1 for a single rank). Below "+
				"thresholds.pool_warn (0.9) heft warns, below thresholds.pool_hold (0.5) it holds the worker. "+
				"Absent while the worker is offline, its pools are unknown, or a rank has no pool yet (pools_incomplete).", worker, nil),
		warning: prometheus.NewDesc("heft_worker_warning_active",
			"1 for each warning the worker carries now, by code and severity, as GET /api/v1/workers shows them; "+
				"the series goes when the warning clears.", with("code", "severity"), nil),
		workers:  prometheus.NewDesc("heft_workers", "Workers in each state.", []string{"state"}, nil),
		warnings: prometheus.NewDesc("heft_warnings", "Workers carrying each warning, by code.", []string{"code"}, nil),
		probes: prometheus.NewDesc("heft_probe_requests_total",
			"Probe requests the fleet made since the coordinator started, by reason; each asks an agent for a burst.", []string{"reason"}, nil),
		handedOver: prometheus.NewDesc("heft_measurements_handed_over_total",
			"Measurements agents offered in their hellos (held from a coordinator), by outcome: taken (no burst asked) or refused "+
				"(the log says why; the worker is measured instead). Offers for a worker the coordinator holds a fresh measurement of are not counted.",
			[]string{"outcome"}, nil),
	}
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.weight, c.state, c.throughput, c.measuredAt, c.pool, c.poolBalance, c.warning,
		c.workers, c.warnings, c.probes, c.handedOver} {
		ch <- d
	}
	c.capacity.describe(ch)
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st := c.fleet.Stats()
	c.capacity.collect(st, ch)
	for _, w := range st.Workers {
		id := []string{w.ID, w.Model, w.Node}
		with := func(extra ...string) []string { return append(slices.Clone(id), extra...) }
		for _, s := range fleet.States {
			gauge(c.state, boolValue(s == w.State), with(s)...)
		}
		if w.Weight != nil {
			gauge(c.weight, *w.Weight, id...)
		}
		if w.MeasuredAt != nil {
			gauge(c.measuredAt, float64(w.MeasuredAt.UnixMilli())/1000, id...)
		}
		for _, x := range w.Warnings {
			gauge(c.warning, 1, with(x.Code, x.Severity)...)
		}
		// An offline or stale worker's numbers are what it was, not what it is.
		if w.State == view.StateOffline || w.State == view.StateStale {
			continue
		}
		if w.Throughput != nil {
			gauge(c.throughput, *w.Throughput, id...)
		}
		for _, r := range w.Ranks {
			gauge(c.pool, float64(r.KVTokens), with(strconv.Itoa(r.DPRank))...)
		}
		if ratio, ok := poolBalance(w.Ranks); ok && w.PoolsWhole {
			gauge(c.poolBalance, ratio, id...)
		}
	}
	for state, n := range st.WorkersByState {
		gauge(c.workers, float64(n), state)
	}
	for code, n := range st.WarningsByCode {
		gauge(c.warnings, float64(n), code)
	}
	for reason, n := range st.ProbeRequests {
		ch <- prometheus.MustNewConstMetric(c.probes, prometheus.CounterValue, float64(n), reason)
	}
	for outcome, n := range st.HandedOver {
		ch <- prometheus.MustNewConstMetric(c.handedOver, prometheus.CounterValue, float64(n), outcome)
	}
}

// poolBalance is smallest over largest pool: health.PoolRatio, and 1 for
// a single rank whose pool is known.
func poolBalance(ranks []wire.Rank) (float64, bool) {
	if len(ranks) == 1 {
		return 1, ranks[0].KVTokens > 0
	}
	ratio, _, _, ok := health.PoolRatio(ranks)
	return ratio, ok
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
