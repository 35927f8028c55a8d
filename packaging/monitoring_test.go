package packaging

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"heft/shared/testutil"
)

// metricSpec is one entry of packaging/prometheus/metrics.yml.
type metricSpec struct {
	Name   string   `yaml:"name"`
	Type   string   `yaml:"type"`
	Labels []string `yaml:"labels"`
	Status string   `yaml:"status"`
	Help   string   `yaml:"help"`
}

// agreedMetrics reads metrics.yml: every metric by name, and which binary
// exports it.
func agreedMetrics(t *testing.T) (map[string]metricSpec, map[string]string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/prometheus/metrics.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var byBinary map[string][]metricSpec
	if err := yaml.Unmarshal(data, &byBinary); err != nil {
		t.Fatalf("metrics.yml: %v", err)
	}
	specs, owner := map[string]metricSpec{}, map[string]string{}
	for binary, list := range byBinary {
		for _, m := range list {
			if _, dup := specs[m.Name]; dup {
				t.Errorf("metrics.yml lists %s twice", m.Name)
			}
			if m.Status != "exists" && m.Status != "planned" {
				t.Errorf("%s: status %q, want exists or planned", m.Name, m.Status)
			}
			if m.Type != "gauge" && m.Type != "counter" {
				t.Errorf("%s: type %q", m.Name, m.Type)
			}
			if (m.Type == "counter") != strings.HasSuffix(m.Name, "_total") {
				t.Errorf("%s: a counter's name ends in _total, and only a counter's", m.Name)
			}
			if m.Help == "" {
				t.Errorf("%s has no help", m.Name)
			}
			specs[m.Name], owner[m.Name] = m, binary
		}
	}
	return specs, owner
}

var (
	identRE   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	selectRE  = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// checkExprMetrics reports every metric an expression names that
// metrics.yml does not list, and every label matcher on a metric that the
// metric does not have (job and instance are Prometheus' own).
func checkExprMetrics(t *testing.T, where, expr string, specs map[string]metricSpec) []string {
	t.Helper()
	// Drop strings and durations, which are not names.
	bare := regexp.MustCompile(`"[^"]*"|\[[^\]]*\]`).ReplaceAllString(expr, `""`)
	var used []string
	for _, id := range identRE.FindAllString(bare, -1) {
		if strings.HasPrefix(id, "heft_") || id == "up" {
			if _, ok := specs[id]; !ok {
				t.Errorf("%s uses %s, which metrics.yml does not list", where, id)
			}
			used = append(used, id)
		}
	}
	for _, m := range selectRE.FindAllStringSubmatch(expr, -1) {
		spec, ok := specs[m[1]]
		if !ok {
			continue // a function's call, or an unknown name reported above
		}
		for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			if l := lm[1]; l != "job" && l != "instance" && !slices.Contains(spec.Labels, l) {
				t.Errorf("%s matches label %q on %s, which has %v", where, l, m[1], spec.Labels)
			}
		}
	}
	return used
}

// promtoolCheck parses every expression with Prometheus' own parser, as
// recording rules in a scratch rules file.
func promtoolCheck(t *testing.T, exprs map[string]string) {
	t.Helper()
	promtool := need(t, "promtool")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	names := make([]string, 0, len(exprs))
	for name := range exprs {
		names = append(names, name)
	}
	slices.Sort(names)
	for i, name := range names {
		rules = append(rules, rule{Record: fmt.Sprintf("heft_check:expr_%d", i), Expr: exprs[name]})
	}
	doc, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "check", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "exprs.yml")
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s\nexpressions, in order: %q", err, out, names)
	}
}

func TestAlertRules(t *testing.T) {
	promtool := need(t, "promtool")
	dir := filepath.Join(testutil.RepoRoot(t), "packaging/prometheus")
	run(t, dir, nil, promtool, "check", "rules", "heft-rules.yml")
	out := run(t, dir, nil, promtool, "test", "rules", "heft-rules.test.yml")
	t.Logf("promtool test rules:\n%s", out)

	specs, _ := agreedMetrics(t)
	data, err := os.ReadFile(filepath.Join(dir, "heft-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				Expr   string            `yaml:"expr"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(dir, "heft-rules.test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExprMetrics(t, "alert "+r.Alert, r.Expr, specs)
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q", r.Alert, s)
			}
			// Each alert is proven to fire by at least one test case.
			if !regexp.MustCompile(`alertname: ` + r.Alert + `\n\s+exp_alerts:\n\s+- exp_labels`).Match(tests) {
				t.Errorf("heft-rules.test.yml never shows %s firing", r.Alert)
			}
		}
	}
	for _, want := range []string{"HeftPoolImbalance", "HeftWorkerOffline", "HeftGPUClockLow", "HeftNoMeasurement",
		"HeftAgentDisconnected", "HeftSyncApplyFailing",
		"HeftSyncDown", "HeftSyncStale", "HeftModelCapacityLow", "HeftModelNoServingWorker"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no %s alert", want)
		}
	}
}

// grafanaPanel is the part of a Grafana panel the test reads.
type grafanaPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	GridPos    map[string]int `json:"gridPos"`
	Datasource struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/grafana/heft.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string         `json:"title"`
		UID        string         `json:"uid"`
		Panels     []grafanaPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("heft.json is not JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("title %q, uid %q", dash.Title, dash.UID)
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	for _, want := range []string{"datasource", "model", "node"} {
		if !vars[want] {
			t.Errorf("no $%s variable", want)
		}
	}

	specs, owner := agreedMetrics(t)
	exprs := map[string]string{}
	usedBy := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos["w"] == 0 || p.GridPos["h"] == 0 || p.GridPos["x"]+p.GridPos["w"] > 24 {
				t.Errorf("panel %q: gridPos %v", p.Title, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource %q, want ${datasource}", p.Title, p.Datasource.UID)
			}
			for _, q := range p.Targets {
				where := fmt.Sprintf("panel %q query %s", p.Title, q.RefID)
				if strings.TrimSpace(q.Expr) == "" {
					t.Errorf("%s is empty", where)
					continue
				}
				for _, m := range checkExprMetrics(t, where, q.Expr, specs) {
					usedBy[owner[m]] = true
				}
				// Grafana fills these in before Prometheus sees the query.
				expr := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$model", ".*", "$node", ".*").Replace(q.Expr)
				if strings.Contains(expr, "$") {
					t.Errorf("%s uses an unknown variable: %s", where, q.Expr)
				}
				exprs[where] = expr
			}
		}
	}
	walk(dash.Panels)
	promtoolCheck(t, exprs)
	// The dashboard shows each binary's metrics, including the GPUs'.
	for _, binary := range []string{"coordinator", "agent", "sync"} {
		if !usedBy[binary] {
			t.Errorf("no panel shows a metric of %s", binary)
		}
	}
}

// TestMetricsContract: a metric metrics.yml says exists is registered by
// a binary today, and one registered under a planned name is marked exists.
func TestMetricsContract(t *testing.T) {
	root := testutil.RepoRoot(t)
	var source strings.Builder
	for _, dir := range []string{"agent", "coordinator", "gateway", "shared"} {
		filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				b, _ := os.ReadFile(p)
				source.Write(b)
			}
			return nil
		})
	}
	specs, _ := agreedMetrics(t)
	for name, m := range specs {
		if name == "up" {
			continue
		}
		registered := strings.Contains(source.String(), `"`+name+`"`)
		switch {
		case m.Status == "exists" && !registered:
			t.Errorf("%s is marked exists, but no binary registers it", name)
		case m.Status == "planned" && registered:
			t.Errorf("%s is registered now: mark it exists in metrics.yml", name)
		}
	}
}
