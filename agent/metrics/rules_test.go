package metrics

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// The example alert rules (packaging/prometheus/heft-rules.yml) fire on
// what the agent really exports: promtool evaluates them over a scrape
// replayed every minute for 20 minutes. A GPU held at 61 % of its maximum
// clock under load is HeftGPUClockLow, an idle GPU at 345 MHz is not, and
// an agent away from its coordinator is HeftAgentDisconnected.
func TestAlertRulesOnAScrape(t *testing.T) {
	promtool, err := exec.LookPath("promtool") // Debian's prometheus package ships it
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing")
		}
		t.Skip("promtool not installed")
	}
	s := fixedState()
	s.Connected = false
	s.GPUs[0].SMClockMHz = 1200 // 61 % of 1980, 97 % busy
	s.GPUs[1] = wire.GPU{Index: 1, UUID: "GPU-idle", MemoryTotal: 80 * gib, MemoryFree: 80 * gib,
		SMClockMHz: 345, SMClockMaxMHz: 1980, ClockEventReasons: []string{"gpu_idle"}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(scrape(t, s)))
	if err != nil {
		t.Fatal(err)
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	var input []series
	for _, name := range slices.Sorted(maps.Keys(mfs)) {
		for _, m := range mfs[name].GetMetric() {
			labels := []string{`job="heft-agent"`}
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+strconv.Quote(lp.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			input = append(input, series{Series: name + "{" + strings.Join(labels, ", ") + "}",
				Values: strconv.FormatFloat(v, 'g', -1, 64) + "x20"})
		}
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	exp := []sample{
		{Labels: `ALERTS{alertname="HeftAgentDisconnected", alertstate="firing", job="heft-agent", node="gpu-a", severity="warning"}`, Value: 1},
		{Labels: fmt.Sprintf(`ALERTS{alertname="HeftGPUClockLow", alertstate="firing", gpu="0", job="heft-agent", node="gpu-a", severity="warning", uuid=%q}`,
			s.GPUs[0].UUID), Value: 1},
	}
	doc, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{filepath.Join(testutil.RepoRoot(t), "packaging/prometheus/heft-rules.yml")},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": input,
			"promql_expr_test": []any{map[string]any{
				"expr": `ALERTS{alertstate="firing"}`, "eval_time": "15m", "exp_samples": exp,
			}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "scrape.test.yml")
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules over the agent's scrape: %v\n%s", err, out)
	}
}
