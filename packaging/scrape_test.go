package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"heft/shared/testutil"
)

// The shipped scrape examples define the three jobs the rules and the
// dashboard assume, and Prometheus' own promtool accepts them. The rule
// file they name is the installed one, so the check reads a copy that
// names the repository's. Debian's promtool is built without Kubernetes
// service discovery: the Kubernetes example is checked with each
// kubernetes_sd_configs swapped for a static target, which still checks
// every relabelling rule.
func TestScrapeConfigs(t *testing.T) {
	promtool := need(t, "promtool")
	dir := filepath.Join(testutil.RepoRoot(t), "packaging/prometheus")
	sdRE := regexp.MustCompile(`(?m)^(\s+)kubernetes_sd_configs:\n(\s+- role: \w+\n(\s+namespaces: .*\n)?)`)
	for _, name := range []string{"scrape.yml", "scrape-kubernetes.yml"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			RuleFiles     []string `yaml:"rule_files"`
			ScrapeConfigs []struct {
				JobName string `yaml:"job_name"`
			} `yaml:"scrape_configs"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var jobs []string
		for _, s := range doc.ScrapeConfigs {
			jobs = append(jobs, s.JobName)
		}
		if want := []string{"heft-coordinator", "heft-agent", "heft-sync"}; !slices.Equal(jobs, want) {
			t.Errorf("%s: jobs %v, want %v", name, jobs, want)
		}
		const installed = "/usr/share/heft/prometheus/heft-rules.yml"
		if !slices.Equal(doc.RuleFiles, []string{installed}) {
			t.Errorf("%s: rule_files %v, want the installed %s", name, doc.RuleFiles, installed)
		}
		text := strings.ReplaceAll(string(data), installed, filepath.Join(dir, "heft-rules.yml"))
		if strings.Contains(name, "kubernetes") {
			n := len(sdRE.FindAllString(text, -1))
			if n != 3 {
				t.Fatalf("%s: %d kubernetes_sd_configs blocks, want 3", name, n)
			}
			text = sdRE.ReplaceAllString(text, "${1}static_configs: [{targets: [\"10.0.0.1:7071\"]}]\n")
		}
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", run(t, dir, nil, promtool, "check", "config", path))
	}
}
