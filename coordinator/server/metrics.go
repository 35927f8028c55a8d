package server

import (
	"net/http"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"heft/shared/version"
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
		m.messages, m.disconnects, m.authFailures, m.authLimited,
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

// fleetCollector turns the fleet's workers into gauges at scrape time.
type fleetCollector struct {
	fleet      fleetAPI
	weight     *prometheus.Desc
	throughput *prometheus.Desc
	workers    *prometheus.Desc
	warnings   *prometheus.Desc
	probes     *prometheus.Desc
}

func newFleetCollector(f fleetAPI) *fleetCollector {
	worker := []string{"id", "model", "node"}
	return &fleetCollector{
		fleet:      f,
		weight:     prometheus.NewDesc("heft_worker_weight", "Routing weight of a worker in the weight table (the pinned one if pinned).", worker, nil),
		throughput: prometheus.NewDesc("heft_worker_throughput_tps", "Measured throughput of a worker in output tokens per second.", worker, nil),
		workers:    prometheus.NewDesc("heft_workers", "Workers by state.", []string{"state"}, nil),
		warnings:   prometheus.NewDesc("heft_warnings", "Workers carrying each health warning, by code.", []string{"code"}, nil),
		probes: prometheus.NewDesc("heft_probe_requests_total",
			"Probe requests the fleet made since the coordinator started, by reason; each asks an agent for a burst.", []string{"reason"}, nil),
	}
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.weight
	ch <- c.throughput
	ch <- c.workers
	ch <- c.warnings
	ch <- c.probes
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.fleet.Stats()
	for _, w := range st.Workers {
		if w.Weight != nil {
			ch <- prometheus.MustNewConstMetric(c.weight, prometheus.GaugeValue, *w.Weight, w.ID, w.Model, w.Node)
		}
		if w.Throughput != nil {
			ch <- prometheus.MustNewConstMetric(c.throughput, prometheus.GaugeValue, *w.Throughput, w.ID, w.Model, w.Node)
		}
	}
	for state, n := range st.WorkersByState {
		ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(n), state)
	}
	for code, n := range st.WarningsByCode {
		ch <- prometheus.MustNewConstMetric(c.warnings, prometheus.GaugeValue, float64(n), code)
	}
	for reason, n := range st.ProbeRequests {
		ch <- prometheus.MustNewConstMetric(c.probes, prometheus.CounterValue, float64(n), reason)
	}
}
