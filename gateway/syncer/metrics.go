package syncer

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"heft/gateway/coord"
	"heft/gateway/target"
	"heft/shared/version"
)

// Metrics are heft-sync's own, on a private registry.
type Metrics struct {
	reg *prometheus.Registry

	applies     *prometheus.CounterVec
	failures    *prometheus.CounterVec
	drift       *prometheus.CounterVec
	lastSuccess *prometheus.GaugeVec
	rounding    *prometheus.GaugeVec
	serving     *prometheus.GaugeVec
	workers     *prometheus.GaugeVec
	setAside    *prometheus.GaugeVec
	dropped     *prometheus.GaugeVec
	drops       *prometheus.CounterVec
	healthy     *prometheus.GaugeVec
	kept        *prometheus.GaugeVec

	coordConnected prometheus.Gauge
	coordErrors    *prometheus.CounterVec
	coordSnapshots prometheus.Counter
	coordLast      prometheus.Gauge
}

// NewMetrics registers every metric; targets' series start at zero.
func NewMetrics(targets []string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_sync_applies_total",
			Help: "Applies to a gateway, by target and result (unchanged: the gateway already matched; changed; failed).",
		}, []string{"target", "result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_sync_apply_failures_total", Help: "Failed applies (and start-up checks), by target and reason.",
		}, []string{"target", "reason"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_sync_drift_repairs_total",
			Help: "Periodic re-applies that found the gateway changed behind heft-sync's back (a restart or reload) and put heft's state back.",
		}, []string{"target"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_last_success_timestamp_seconds", Help: "When the gateway last matched heft's state after an apply (Unix time).",
		}, []string{"target"}),
		rounding: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_rounding_error_ratio",
			Help: "Largest relative error of a serving worker's share of traffic after scaling weights to the gateway's integers.",
		}, []string{"target"}),
		serving: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_serving_workers", Help: "Workers the gateway sends new requests to, by target.",
		}, []string{"target"}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_model_workers", Help: "Workers of the target's model the coordinator lists, in any state.",
		}, []string{"target"}),
		setAside: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_workers_set_aside",
			Help: "Workers of the target's model the gateway cannot use as the coordinator gives them: left out (an address that cannot be read) or drained (admitted with a weight that is not above zero).",
		}, []string{"target"}),
		dropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_workers_dropped",
			Help: "Workers the last apply left out of the gateway because it could not take them (an address no gateway may be given, an entry its config check refused), while the others were applied.",
		}, []string{"target"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_sync_worker_drops_total",
			Help: "Times a worker was left out of the gateway because it could not take it, counted when a worker starts being left out.",
		}, []string{"target"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_target_healthy", Help: "1 when the target's last apply or check succeeded, else 0.",
		}, []string{"target"}),
		kept: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "heft_sync_kept_workers",
			Help: "Workers heft-sync keeps serving at their last weights against the coordinator's state, by target and reason (unlisted: the coordinator lists them no more, or as unmeasured; floor: dropping them would take the model below min_serving or min_serving_capacity; node_pending: their node waits for an admin's approval).",
		}, []string{"target", "reason"}),
		coordConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "heft_sync_coordinator_connected", Help: "1 while heft-sync follows the coordinator's event stream.",
		}),
		coordErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "heft_sync_coordinator_errors_total", Help: "Lost or refused connections to the coordinator, by reason.",
		}, []string{"reason"}),
		coordSnapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "heft_sync_coordinator_snapshots_total", Help: "Complete, valid fleet states read from the coordinator.",
		}),
		coordLast: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "heft_sync_coordinator_last_snapshot_timestamp_seconds", Help: "When the last valid fleet state was read (Unix time).",
		}),
	}
	for _, t := range targets {
		for _, r := range []string{resultUnchanged, resultChanged, resultFailed} {
			m.applies.WithLabelValues(t, r)
		}
		for _, r := range target.Reasons {
			m.failures.WithLabelValues(t, r)
		}
		m.drift.WithLabelValues(t)
		m.setAside.WithLabelValues(t)
		for _, reason := range keptReasons {
			m.kept.WithLabelValues(t, reason)
		}
		m.dropped.WithLabelValues(t)
		m.drops.WithLabelValues(t)
	}
	for _, r := range coord.Reasons {
		m.coordErrors.WithLabelValues(r)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.applies, m.failures, m.drift, m.lastSuccess, m.rounding, m.serving, m.workers, m.setAside, m.dropped, m.drops, m.healthy, m.kept,
		m.coordConnected, m.coordErrors, m.coordSnapshots, m.coordLast,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "heft_sync_build_info", Help: "heft-sync's version, as a label.",
			ConstLabels: prometheus.Labels{"version": version.Version},
		}, func() float64 { return 1 }),
	)
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is where the metrics live, for tests that read them.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// CoordinatorHooks returns follower hooks that keep the coordinator
// metrics, calling next (which may have nil fields) as well.
func (m *Metrics) CoordinatorHooks(next coord.Hooks) coord.Hooks {
	return coord.Hooks{
		Snapshot: func(s coord.Snapshot) {
			m.coordSnapshots.Inc()
			m.coordLast.Set(float64(s.At.UnixNano()) / 1e9)
			if next.Snapshot != nil {
				next.Snapshot(s)
			}
		},
		Connected: func(c bool) {
			if c {
				m.coordConnected.Set(1)
			} else {
				m.coordConnected.Set(0)
			}
			if next.Connected != nil {
				next.Connected(c)
			}
		},
		Error: func(reason string, err error) {
			m.coordErrors.WithLabelValues(reason).Inc()
			if next.Error != nil {
				next.Error(reason, err)
			}
		},
		Pending: next.Pending,
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
