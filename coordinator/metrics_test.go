package coordinator

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/version"
	"heft/shared/wire"
)

// metricsFleet builds a fixed fleet on clk: two admitted workers (one
// pinned), one held for uneven pools, one measuring, one pending and one
// offline on another model.
func metricsFleet(t *testing.T, clk *clock) *Coordinator {
	t.Helper()
	c, err := New(testConfig(t), WithLogger(testLogger(t)), WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	f := c.Fleet()
	answer := func(node string, acts []fleet.Action, tps map[string]float64) {
		t.Helper()
		for _, a := range acts {
			req, ok := a.Message.(*wire.ProbeRequest)
			if !ok || tps[req.CapacityKey] == 0 {
				continue
			}
			m := measured(req.CapacityKey, node, tps[req.CapacityKey], clk.now())
			m.Model = "" // the worker's
			if _, err := f.ProbeResult(node, wire.ProbeResult{RequestID: req.RequestID, Measurement: m}); err != nil {
				t.Fatal(err)
			}
		}
	}

	uneven := engine("gpu-a|uneven", 8002)
	uneven.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	fast := engine("gpu-a|fast", 8000)
	fast.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 500000}}
	f.Connect("gpu-a", 1, wire.Hello{Node: "gpu-a"})
	answer("gpu-a", f.Snapshot("gpu-a", snapshot("gpu-a", clk.now(), fast, engine("gpu-a|slow", 8001), uneven)),
		map[string]float64{"gpu-a|fast": 1200, "gpu-a|slow": 600, "gpu-a|uneven": 1000})
	if err := f.Pin("gpu-a|slow", 0.75); err != nil {
		t.Fatal(err)
	}

	down := engine("gpu-b|down", 8000)
	down.Ready, down.Error = false, "connection refused"
	f.Connect("gpu-b", 2, wire.Hello{Node: "gpu-b"})
	f.Snapshot("gpu-b", snapshot("gpu-b", clk.now(), engine("gpu-b|new", 8001), down))

	other := engine("gpu-c|llama", 8000)
	other.Model = "meta-llama/Llama-3.1-8B"
	other.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 1000}, {DPRank: 1, KVTokens: 100}}
	f.Connect("gpu-c", 3, wire.Hello{Node: "gpu-c"})
	answer("gpu-c", f.Snapshot("gpu-c", snapshot("gpu-c", clk.now(), other)), map[string]float64{"gpu-c|llama": 800})
	f.Disconnect("gpu-c", 3)
	clk.add(time.Minute) // past the offline grace
	f.Tick()
	return c
}

// scrape answers the coordinator's /metrics in the text exposition.
func scrape(t *testing.T, c *Coordinator) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	c.Server().Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

// The coordinator's own lines on /metrics (heft_*) for metricsFleet,
// byte for byte. Run go test with -update after an intended change and
// review the diff.
func TestMetricsGolden(t *testing.T) {
	c := metricsFleet(t, newClock())
	testutil.Golden(t, filepath.Join("testdata", "golden", "metrics.txt"), heftLines(scrape(t, c)))
}

// heftLines keeps the lines of a text exposition that belong to heft's
// own families (the Go and process collectors' values change from run to
// run), with the build's version written as "(version)".
func heftLines(exposition []byte) []byte {
	exposition = bytes.ReplaceAll(exposition, []byte(`version="`+version.Version+`"`), []byte(`version="(version)"`))
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	for sc.Scan() {
		line := sc.Text()
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, "heft_") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}

// families parses a text exposition with the Prometheus parser.
func families(t *testing.T, exposition []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// agreedMetric is one entry of packaging/prometheus/metrics.yml, the list
// the alert rules and the Grafana dashboard are written against.
type agreedMetric struct {
	Name   string   `yaml:"name"`
	Type   string   `yaml:"type"`
	Labels []string `yaml:"labels"`
	Status string   `yaml:"status"`
}

// What the coordinator exports is what metrics.yml lists for it, family
// for family: the name, the type and the label names of every sample; and
// every heft_* family it exports is listed.
func TestMetricsMatchTheAgreedList(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/prometheus/metrics.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var agreed struct {
		Coordinator []agreedMetric `yaml:"coordinator"`
	}
	if err := yaml.Unmarshal(data, &agreed); err != nil {
		t.Fatal(err)
	}
	mfs := families(t, scrape(t, metricsFleet(t, newClock())))
	listed := map[string]bool{}
	for _, m := range agreed.Coordinator {
		listed[m.Name] = true
		mf := mfs[m.Name]
		if m.Status != "exists" {
			if mf != nil {
				t.Errorf("%s is exported but metrics.yml says %s", m.Name, m.Status)
			}
			continue
		}
		if mf == nil {
			t.Errorf("metrics.yml says %s exists; the coordinator does not export it", m.Name)
			continue
		}
		if got := strings.ToLower(mf.GetType().String()); got != m.Type {
			t.Errorf("%s is a %s, metrics.yml says %s", m.Name, got, m.Type)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no HELP", m.Name)
		}
		for _, s := range mf.GetMetric() {
			var names []string
			for _, lp := range s.GetLabel() {
				names = append(names, lp.GetName())
			}
			if !sameSet(names, m.Labels) {
				t.Errorf("%s sample has labels %v, metrics.yml says %v", m.Name, names, m.Labels)
				break
			}
		}
	}
	for name := range mfs {
		if strings.HasPrefix(name, "heft_") && !listed[name] {
			t.Errorf("the coordinator exports %s, which metrics.yml does not list", name)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	return slices.Equal(a, b)
}

// The example alert rules (packaging/prometheus/heft-rules.yml) fire on
// what the coordinator really exports: promtool evaluates them over a
// scrape of metricsFleet, replayed every minute for 9 hours. The fleet's
// clock starts an hour after the Unix epoch so that promtool's time(),
// which starts at 0, can age the measurements past the 7 h of
// HeftNoMeasurement.
func TestAlertRulesOnAScrape(t *testing.T) {
	clk := &clock{t: time.Unix(3600, 0).UTC()}
	mfs := families(t, scrape(t, metricsFleet(t, clk)))
	maps.DeleteFunc(mfs, func(name string, _ *dto.MetricFamily) bool { return !strings.HasPrefix(name, "heft_") })
	worker := func(id, model, node string) string {
		return fmt.Sprintf(`id=%q, job="heft-coordinator", model=%q, node=%q`, id, model, node)
	}
	qwen, llama := testModel, "meta-llama/Llama-3.1-8B"
	testutil.AlertsOnAScrape(t, filepath.Join(testutil.RepoRoot(t), "packaging/prometheus/heft-rules.yml"), "heft-coordinator", mfs, 600, "9h", []string{
		`alertname="HeftWorkerOffline", ` + worker("gpu-c|llama", llama, "gpu-c") + `, severity="warning", state="offline"`,
		`alertname="HeftPoolImbalance", ` + worker("gpu-a|uneven", qwen, "gpu-a") + `, severity="warning"`,
		`alertname="HeftPoolImbalanceCritical", ` + worker("gpu-a|uneven", qwen, "gpu-a") + `, severity="critical"`,
		`alertname="HeftWorkerCriticalWarning", code="agent_offline", ` + worker("gpu-c|llama", llama, "gpu-c") + `, severity="critical"`,
		`alertname="HeftWorkerCriticalWarning", code="dp_pool_imbalance", ` + worker("gpu-a|uneven", qwen, "gpu-a") + `, severity="critical"`,
		`alertname="HeftWorkerCriticalWarning", code="dp_pool_imbalance", ` + worker("gpu-c|llama", llama, "gpu-c") + `, severity="critical"`,
		`alertname="HeftWorkerCriticalWarning", code="engine_unreachable", ` + worker("gpu-b|down", qwen, "gpu-b") + `, severity="critical"`,
		// Measured at 1 h, so 8 h old at 9 h; gpu-c is offline, which HeftWorkerOffline covers.
		`alertname="HeftNoMeasurement", ` + worker("gpu-a|fast", qwen, "gpu-a") + `, severity="warning"`,
		`alertname="HeftNoMeasurement", ` + worker("gpu-a|slow", qwen, "gpu-a") + `, severity="warning"`,
		`alertname="HeftNoMeasurement", ` + worker("gpu-a|uneven", qwen, "gpu-a") + `, severity="warning"`,
		// Qwen serves 1,800 of its measured 2,800 tok/s (gpu-a|uneven held);
		// Llama's only worker is offline.
		`alertname="HeftModelCapacityLow", job="heft-coordinator", model="` + qwen + `", severity="warning"`,
		`alertname="HeftModelNoServingWorker", job="heft-coordinator", model="` + llama + `", severity="critical"`,
	})
}

// A worker's series follow it: a stale worker says so in
// heft_worker_state and exports its weight but no throughput or pools at
// the next scrape after the grace, an offline one (past
// stale_weight_ttl) not even its weight, and a forgotten one nothing.
func TestMetricsFollowTheWorker(t *testing.T) {
	clk := newClock()
	c, err := New(testConfig(t), WithLogger(testLogger(t)), WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := c.Fleet()
	e := engine("gpu-a|w", 8000)
	e.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 900}, {DPRank: 1, KVTokens: 1000}}
	f.Connect("gpu-a", 1, wire.Hello{Node: "gpu-a"})
	for _, a := range f.Snapshot("gpu-a", snapshot("gpu-a", clk.now(), e)) {
		if req, ok := a.Message.(*wire.ProbeRequest); ok {
			if _, err := f.ProbeResult("gpu-a", wire.ProbeResult{RequestID: req.RequestID, Measurement: measured("gpu-a|w", "gpu-a", 900, clk.now())}); err != nil {
				t.Fatal(err)
			}
		}
	}
	labels := `id="gpu-a|w",model="` + testModel + `",node="gpu-a"`
	has := func(prefix string) bool {
		for _, line := range strings.Split(string(scrape(t, c)), "\n") {
			if strings.HasPrefix(line, prefix) {
				return true
			}
		}
		return false
	}
	for _, line := range []string{
		`heft_worker_state{` + labels + `,state="admitted"} 1`, `heft_worker_state{` + labels + `,state="offline"} 0`,
		`heft_worker_throughput_tokens_per_second{` + labels + `} 900`, `heft_worker_weight{` + labels + `} 1`,
		`heft_worker_kv_pool_tokens{dp_rank="1",` + labels + `} 1000`, `heft_worker_kv_pool_balance_ratio{` + labels + `} 0.9`,
	} {
		if !has(line) {
			t.Errorf("connected: no %s", line)
		}
	}

	f.Disconnect("gpu-a", 1)
	clk.add(fleet.DefaultConfig().OfflineGrace)
	f.Tick()
	// Stale: still routed at its weight, its other numbers are the past.
	if !has(`heft_worker_state{`+labels+`,state="stale"} 1`) || !has(`heft_worker_state{`+labels+`,state="admitted"} 0`) {
		t.Error("stale after the grace: heft_worker_state does not say so")
	}
	if !has(`heft_worker_warning_active{code="agent_offline",`+labels+`,severity="warning"} 1`) || !has(`heft_worker_weight{`+labels+`} 1`) {
		t.Error("stale: no agent_offline warning series, or no weight")
	}
	for _, gone := range []string{"heft_worker_throughput_tokens_per_second{", "heft_worker_kv_pool_tokens{", "heft_worker_kv_pool_balance_ratio{"} {
		if has(gone) {
			t.Errorf("stale: %s is still exported", gone)
		}
	}

	clk.add(fleet.DefaultConfig().CacheTTL) // the default stale_weight_ttl
	f.Tick()
	if !has(`heft_worker_state{`+labels+`,state="offline"} 1`) || !has(`heft_worker_state{`+labels+`,state="stale"} 0`) {
		t.Error("offline after the grace: heft_worker_state does not say so")
	}
	if !has(`heft_worker_warning_active{code="agent_offline",` + labels + `,severity="critical"} 1`) {
		t.Error("offline: no agent_offline warning series")
	}
	for _, gone := range []string{"heft_worker_throughput_tokens_per_second{", "heft_worker_weight{", "heft_worker_kv_pool_tokens{",
		"heft_worker_kv_pool_balance_ratio{"} {
		if has(gone) {
			t.Errorf("offline: %s is still exported", gone)
		}
	}
	if !has(`heft_worker_last_measured_timestamp_seconds{` + labels + `}`) {
		t.Error("offline: the last measurement's time is gone; it is still true")
	}

	clk.add(fleet.DefaultConfig().ForgetAfter)
	f.Tick()
	if has(`heft_worker_`) {
		t.Errorf("forgotten: series remain:\n%s", heftLines(scrape(t, c)))
	}
}

// A worker whose pool set is incomplete exports the pools it has but no
// balance, and carries pools_incomplete.
func TestMetricsIncompletePools(t *testing.T) {
	clk := newClock()
	c, err := New(testConfig(t), WithLogger(testLogger(t)), WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := c.Fleet()
	e := engine("gpu-a|w", 8000)
	e.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 900}, {DPRank: 1, KVTokens: 1000}}
	e.ExpectedRanks, e.Complete, e.MissingRanks = 3, new(false), []int{2}
	f.Connect("gpu-a", 1, wire.Hello{Node: "gpu-a"})
	f.Snapshot("gpu-a", snapshot("gpu-a", clk.now(), e))
	text := string(scrape(t, c))
	labels := `id="gpu-a|w",model="` + testModel + `",node="gpu-a"`
	for _, want := range []string{`heft_worker_kv_pool_tokens{dp_rank="1",` + labels + `} 1000`,
		`heft_worker_warning_active{code="pools_incomplete",` + labels + `,severity="warning"} 1`} {
		if !strings.Contains(text, want) {
			t.Errorf("no %s", want)
		}
	}
	if strings.Contains(text, "heft_worker_kv_pool_balance_ratio{") {
		t.Error("a balance from an incomplete set")
	}
}

// The capacity series have a value in every state: an admin's hold moves
// the worker's hold reason to admin and its throughput out of the model's
// admitted capacity, and every series stays present.
func TestMetricsCapacityInEveryState(t *testing.T) {
	c := metricsFleet(t, newClock())
	value := func(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
		for _, m := range mfs[name].GetMetric() {
			match := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					match++
				}
			}
			if match == len(labels) {
				return m.GetGauge().GetValue(), true
			}
		}
		return 0, false
	}
	fast := map[string]string{"id": "gpu-a|fast"}
	want := func(mfs map[string]*dto.MetricFamily, name string, labels map[string]string, v float64) {
		t.Helper()
		got, ok := value(mfs, name, labels)
		if !ok {
			t.Errorf("%s%v is absent", name, labels)
		} else if got != v {
			t.Errorf("%s%v = %v, want %v", name, labels, got, v)
		}
	}
	with := func(k, v string) map[string]string { return map[string]string{"id": "gpu-a|fast", k: v} }
	qwen := map[string]string{"model": testModel}

	mfs := families(t, scrape(t, c))
	want(mfs, "heft_model_admitted_capacity_tokens_per_second", qwen, 1800)
	want(mfs, "heft_model_serving_workers", qwen, 2)
	want(mfs, "heft_worker_hold_reason", with("reason", "admin"), 0)
	want(mfs, "heft_worker_pinned", with("kind", "decode"), 0)
	want(mfs, "heft_worker_pinned", map[string]string{"id": "gpu-a|slow", "kind": "decode"}, 1)

	if err := c.Fleet().Hold("gpu-a|fast"); err != nil {
		t.Fatal(err)
	}
	mfs = families(t, scrape(t, c))
	want(mfs, "heft_worker_hold_reason", with("reason", "admin"), 1)
	want(mfs, "heft_worker_hold_reason", with("reason", "outlier"), 0)
	want(mfs, "heft_model_admitted_capacity_tokens_per_second", qwen, 600)
	want(mfs, "heft_model_measured_capacity_tokens_per_second", qwen, 2800)
	want(mfs, "heft_model_serving_workers", qwen, 1)
	want(mfs, "heft_worker_prefill_weight", fast, 0)
	want(mfs, "heft_worker_max_context_tokens", fast, 500000)
}
