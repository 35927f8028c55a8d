package server

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"heft/coordinator/fleet"
	"heft/shared/view"
)

// capacityDescs are the series an alert or a dashboard needs in every
// state: each has a value (0 or 1, or 0 for unknown) for as long as its
// worker or model is known, so no query needs absent(). Per model: what
// its admitted workers carry against what all its measured workers would.
type capacityDescs struct {
	prefillWeight, maxConcurrency, maxContext, pinned, holdReason *prometheus.Desc
	admitted, measured, serving, workers                          *prometheus.Desc
}

func newCapacityDescs() capacityDescs {
	worker := []string{"id", "model", "node"}
	with := func(extra string) []string { return append(slices.Clone(worker), extra) }
	model := []string{"model"}
	return capacityDescs{
		prefillWeight: prometheus.NewDesc("heft_worker_prefill_weight",
			"Prefill weight of the worker (its prompt tokens per second over its model's median, or the pinned one); "+
				"0 while it is not in the prefill weight table.", worker, nil),
		maxConcurrency: prometheus.NewDesc("heft_worker_max_concurrency",
			"The most requests a gateway should have open on the worker (max_concurrency); 0 while the engine's limit is unknown.", worker, nil),
		maxContext: prometheus.NewDesc("heft_worker_max_context_tokens",
			"The longest sequence the worker can hold: the smaller of its maximum model length and its smallest rank's KV pool; "+
				"0 while unknown.", worker, nil),
		pinned: prometheus.NewDesc("heft_worker_pinned",
			"1 while an admin pins the worker's weight of this kind (decode, prefill), else 0.", with("kind"), nil),
		holdReason: prometheus.NewDesc("heft_worker_hold_reason",
			"1 for the reason a held worker is held (admin, invalid_measurement, dp_pool_imbalance, implausible_measurement, "+
				"outlier), 0 for each other one; all 0 while the worker is not held.", with("reason"), nil),
		admitted: prometheus.NewDesc("heft_model_admitted_capacity_tokens_per_second",
			"Sum of the measured output tokens per second of the model's admitted workers: the capacity its connected agents confirm. "+
				"A stale worker (its agent away, still routed at its last weight) does not count.", model, nil),
		measured: prometheus.NewDesc("heft_model_measured_capacity_tokens_per_second",
			"Sum of the newest valid measurement of every worker of the model the coordinator remembers, whatever its state "+
				"(offline and held included, until forgotten): what the model would carry with every worker admitted.", model, nil),
		serving: prometheus.NewDesc("heft_model_serving_workers",
			"Workers of the model in its weight table, admitted or stale: what gateways send requests to.", model, nil),
		workers: prometheus.NewDesc("heft_model_workers",
			"Workers of the model the coordinator remembers, in any state.", model, nil),
	}
}

func (d capacityDescs) describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{d.prefillWeight, d.maxConcurrency, d.maxContext, d.pinned, d.holdReason,
		d.admitted, d.measured, d.serving, d.workers} {
		ch <- x
	}
}

// collect exports the capacity series of a fleet's stats.
func (d capacityDescs) collect(st fleet.Stats, ch chan<- prometheus.Metric) {
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	type totals struct {
		admitted, measured float64
		serving, workers   int
	}
	models := map[string]*totals{}
	for _, w := range st.Workers {
		id := []string{w.ID, w.Model, w.Node}
		gauge(d.prefillWeight, deref(w.PrefillWeight), id...)
		n := 0.0
		if w.MaxConcurrency != nil {
			n = float64(*w.MaxConcurrency)
		}
		gauge(d.maxConcurrency, n, id...)
		n = 0
		if w.MaxContextTokens != nil {
			n = float64(*w.MaxContextTokens)
		}
		gauge(d.maxContext, n, id...)
		gauge(d.pinned, boolValue(w.Pinned), append(slices.Clone(id), view.WeightDecode)...)
		gauge(d.pinned, boolValue(w.PrefillPinned), append(slices.Clone(id), view.WeightPrefill)...)
		for _, r := range fleet.HoldReasons {
			gauge(d.holdReason, boolValue(w.HoldReason == r), append(slices.Clone(id), r)...)
		}
		if w.Model == "" {
			continue
		}
		t := models[w.Model]
		if t == nil {
			t = &totals{}
			models[w.Model] = t
		}
		t.workers++
		if w.Throughput != nil {
			t.measured += *w.Throughput
			if w.State == view.StateAdmitted {
				t.admitted += *w.Throughput
			}
		}
		if w.State == view.StateAdmitted || w.State == view.StateStale {
			t.serving++
		}
	}
	for m, t := range models {
		gauge(d.admitted, t.admitted, m)
		gauge(d.measured, t.measured, m)
		gauge(d.serving, float64(t.serving), m)
		gauge(d.workers, float64(t.workers), m)
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}
