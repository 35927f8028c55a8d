package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"heft/coordinator/config"
	"heft/gateway/app"
	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/sim"
)

// TestPrometheusAlerts runs the real Prometheus on the shipped scrape
// example (packaging/prometheus/scrape.yml) and alert rules, scraping a
// real coordinator, two agents and heft-sync. Only the intervals and the
// rules' for: durations are shortened, and the example's targets replaced
// by this test's addresses. Killing heft-sync fires HeftSyncDown; one of
// the model's two equal workers going offline (half its capacity) fires
// HeftModelCapacityLow.
func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	prom := need(t, "prometheus")
	root := testutil.RepoRoot(t)
	dir := t.TempDir()
	c := startCoordinatorWith(t, filepath.Join(dir, "state"), "127.0.0.1:0", func(cfg *config.Config) {
		cfg.Fleet.OfflineGrace = 2 * time.Second
	})

	// Two equal workers of one model, each with an agent that serves /metrics.
	var agentAddrs []string
	var agents []*agent
	for _, node := range []string{"gpu-a", "gpu-b"} {
		logPath := filepath.Join(dir, node+".log")
		s := startSim(t, sim.Config{Flavor: "vllm", Model: model, SingleTPS: 200, Batch16TPS: 1600, LogPath: logPath}, "127.0.0.1:0")
		listen := fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
		agentAddrs = append(agentAddrs, listen)
		agents = append(agents, runAgentConfig(t, fmt.Sprintf("listen = %q\n[coordinator]\nurl = %q\ntoken = %q\n[node]\nname = %q\n"+
			"[[engine]]\nkind = \"vllm\"\nurl = %q\nlog = %q\n", listen, "ws://"+c.addr+"/api/v1/agent", agentToken, node, s.URL(), logPath)))
	}
	c.waitFor(t, "both workers admitted", 90*time.Second, settled("gpu-a", "gpu-b"))

	// heft-sync writing a LiteLLM model list: a gateway that needs no daemon.
	syncListen := fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
	syncConf := filepath.Join(dir, "sync.toml")
	writeFile(t, syncConf, fmt.Sprintf("listen = %q\nresync = \"1s\"\n[coordinator]\nurl = %q\n[[litellm]]\nmodel = %q\nfile = %q\n",
		syncListen, "http://"+c.addr, model, filepath.Join(dir, "litellm.yaml")))
	syncCtx, stopSync := context.WithCancel(context.Background())
	syncDone := make(chan int, 1)
	syncOut := &testutil.SyncBuffer{}
	go func() {
		syncDone <- app.Main(syncCtx, []string{"--config", syncConf}, func(string) string { return "" }, syncOut, syncOut)
	}()
	syncStopped := false
	stopHeftSync := func() {
		if syncStopped {
			return
		}
		syncStopped = true
		stopSync()
		if code := <-syncDone; code != 0 {
			t.Errorf("heft-sync exited %d:\n%s", code, syncOut.String())
		}
	}
	t.Cleanup(stopHeftSync)
	gwtest.WaitHTTP(t, "http://"+syncListen+"/healthz")

	// Prometheus on the shipped files.
	rules := shortRules(t, filepath.Join(root, "packaging/prometheus/heft-rules.yml"), filepath.Join(dir, "heft-rules.yml"))
	promConf := filepath.Join(dir, "prometheus.yml")
	promConfig(t, filepath.Join(root, "packaging/prometheus/scrape.yml"), promConf, rules, map[string][]string{
		"heft-coordinator": {c.addr}, "heft-agent": agentAddrs, "heft-sync": {syncListen},
	})
	promAddr := fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
	promOut := &testutil.SyncBuffer{}
	cmd := exec.Command(prom, "--config.file="+promConf, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = promOut, promOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", promOut.String())
		}
	})
	p := promAPI{t: t, base: "http://" + promAddr}

	testutil.Eventually(t, "Prometheus scraping all four targets", time.Minute, func() bool {
		return p.upTargets() == 4
	})
	// On a loaded machine a scrape can outlast its 1 s timeout, and two in a
	// row fire HeftSyncDown as they should. The claim here is about a fleet
	// whose scrapes all work: wait until they have for a while and the rules
	// have been evaluated since.
	p.waitScrapesHealthy(4, 5*time.Second)
	if a := p.firing("HeftSyncDown", "HeftModelCapacityLow", "HeftModelNoServingWorker"); len(a) > 0 {
		t.Errorf("alerts firing on a healthy fleet: %v", a)
	}

	stopHeftSync()
	testutil.Eventually(t, "HeftSyncDown firing", time.Minute, func() bool {
		return len(p.firing("HeftSyncDown")) == 1
	})

	agents[1].stop(t)
	testutil.Eventually(t, "HeftModelCapacityLow firing for "+model, time.Minute, func() bool {
		for _, a := range p.firing("HeftModelCapacityLow") {
			if a["model"] == model {
				return true
			}
		}
		return false
	})
	if a := p.firing("HeftModelNoServingWorker"); len(a) > 0 {
		t.Errorf("HeftModelNoServingWorker fires with one worker serving: %v", a)
	}
}

func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing", tool)
		}
		t.Skipf("%s not installed", tool)
	}
	return p
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// shortRules copies the shipped rules with every for: duration at 2 s.
func shortRules(t *testing.T, from, to string) string {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAllString(string(data), "$1 2s")
	writeFile(t, to, text)
	return to
}

// promConfig copies the shipped scrape example with 1 s intervals, the
// given rule file and each job's targets.
func promConfig(t *testing.T, from, to, rules string, targets map[string][]string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["global"] = map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
	doc["rule_files"] = []string{rules}
	jobs, _ := doc["scrape_configs"].([]any)
	for _, j := range jobs {
		job := j.(map[string]any)
		name, _ := job["job_name"].(string)
		addrs, ok := targets[name]
		if !ok {
			t.Fatalf("scrape.yml has a job %q this test does not run", name)
		}
		if _, ok := job["static_configs"]; !ok {
			t.Fatalf("job %s has no static_configs", name)
		}
		job["static_configs"] = []any{map[string]any{"targets": addrs}}
		delete(targets, name)
	}
	if len(targets) > 0 {
		t.Fatalf("scrape.yml lacks the jobs %v", targets)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(out))
}

// promAPI reads a Prometheus server's HTTP API.
type promAPI struct {
	t    *testing.T
	base string
}

func (p promAPI) get(path string, out any) bool {
	resp, err := http.Get(p.base + path)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	defer http.DefaultClient.CloseIdleConnections()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(out) == nil
}

// upTargets counts the active targets whose last scrape worked.
func (p promAPI) upTargets() int {
	var r struct {
		Data struct {
			ActiveTargets []struct {
				Health string `json:"health"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if !p.get("/api/v1/targets", &r) {
		return 0
	}
	n := 0
	for _, tg := range r.Data.ActiveTargets {
		if tg.Health == "up" {
			n++
		}
	}
	return n
}

// waitScrapesHealthy waits until n targets' scrapes have all worked over
// the last window, with the rules evaluated all through it and once after:
// long enough for a rule that misfires to be firing by then.
func (p promAPI) waitScrapesHealthy(n int, window time.Duration) {
	p.t.Helper()
	var rulesFrom time.Time
	testutil.Eventually(p.t, "the rules evaluated", time.Minute, func() bool {
		rulesFrom = p.lastEvaluation()
		return !rulesFrom.IsZero()
	})
	expr := fmt.Sprintf("min_over_time(up[%ds])", int(window.Seconds()))
	var since time.Time
	testutil.Eventually(p.t, fmt.Sprintf("every scrape of %d targets working for %v", n, window), 2*time.Minute, func() bool {
		values, at := p.query(expr)
		if len(values) != n || at.Sub(rulesFrom) < window {
			return false
		}
		for _, v := range values {
			if v != "1" {
				return false
			}
		}
		since = at
		return true
	})
	testutil.Eventually(p.t, "the rules evaluated after the fleet's scrapes worked", time.Minute, func() bool {
		return p.lastEvaluation().After(since)
	})
}

// lastEvaluation is when the rule group evaluated least recently last
// ran, zero before every group has run once.
func (p promAPI) lastEvaluation() time.Time {
	var r struct {
		Data struct {
			Groups []struct {
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"groups"`
		} `json:"data"`
	}
	if !p.get("/api/v1/rules", &r) || len(r.Data.Groups) == 0 {
		return time.Time{}
	}
	oldest := r.Data.Groups[0].LastEvaluation
	for _, g := range r.Data.Groups {
		if g.LastEvaluation.Before(oldest) {
			oldest = g.LastEvaluation
		}
	}
	if oldest.Year() < 2000 { // Prometheus shows a group not yet run as year 1
		return time.Time{}
	}
	return oldest
}

// query runs an instant query and returns its samples' values and the
// server's evaluation time.
func (p promAPI) query(expr string) (values []string, at time.Time) {
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if !p.get("/api/v1/query?query="+url.QueryEscape(expr), &r) {
		return nil, time.Time{}
	}
	for _, s := range r.Data.Result {
		ts, _ := s.Value[0].(float64)
		v, _ := s.Value[1].(string)
		values = append(values, v)
		at = time.UnixMilli(int64(ts * 1000))
	}
	return values, at
}

// firing returns the labels of the firing alerts with one of the names.
func (p promAPI) firing(names ...string) []map[string]string {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if !p.get("/api/v1/alerts", &r) {
		return nil
	}
	var out []map[string]string
	for _, a := range r.Data.Alerts {
		for _, n := range names {
			if a.State == "firing" && a.Labels["alertname"] == n {
				out = append(out, a.Labels)
			}
		}
	}
	if len(out) > 0 {
		p.t.Logf("firing: %v", strings.TrimSpace(fmt.Sprint(out)))
	}
	return out
}
