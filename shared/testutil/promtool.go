package testutil

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"
)

// AlertsOnAScrape has promtool evaluate the alert rules of ruleFile over
// a scrape: every series of families, labelled job="<job>", holding its
// value for `minutes` one-minute steps. At evalTime ("9h") the alerts
// firing must be exactly want, each written as the labels inside
// ALERTS{alertstate="firing", ...} in promtool's order (alphabetical).
// Without promtool the test is skipped, or fails under CI, which installs
// it (Debian's prometheus package ships it).
func AlertsOnAScrape(t testing.TB, ruleFile, job string, families map[string]*dto.MetricFamily, minutes int, evalTime string, want []string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is missing")
		}
		t.Skip("promtool not installed")
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	var input []series
	for _, name := range slices.Sorted(maps.Keys(families)) {
		for _, m := range families[name].GetMetric() {
			labels := []string{"job=" + strconv.Quote(job)}
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+strconv.Quote(lp.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			input = append(input, series{Series: name + "{" + strings.Join(labels, ", ") + "}",
				Values: strconv.FormatFloat(v, 'g', -1, 64) + "x" + strconv.Itoa(minutes)})
		}
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	var exp []sample
	for _, l := range want {
		exp = append(exp, sample{Labels: `ALERTS{alertstate="firing", ` + l + `}`, Value: 1})
	}
	doc, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{ruleFile},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":     "1m",
			"input_series": input,
			"promql_expr_test": []any{map[string]any{
				"expr": `ALERTS{alertstate="firing"}`, "eval_time": evalTime, "exp_samples": exp,
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
		t.Errorf("promtool test rules over a real scrape: %v\n%s", err, out)
	}
}
