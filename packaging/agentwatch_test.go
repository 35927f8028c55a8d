package packaging

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"gopkg.in/yaml.v3"

	"heft/agent/config"
	"heft/shared/testutil"
)

// listenPort reads an agent config's listen setting through the agent's
// own parser; 0 when it is off.
func listenPort(t *testing.T, where, text string) int {
	t.Helper()
	cfg := config.Default()
	if err := cfg.Parse(text); err != nil {
		t.Fatalf("%s: the agent refuses its config: %v", where, err)
	}
	if cfg.Listen == "" {
		return 0
	}
	_, port, err := net.SplitHostPort(cfg.Listen)
	n, _ := strconv.Atoi(port)
	if err != nil || n <= 0 {
		t.Fatalf("%s: listen %q is not host:port with a fixed port", where, cfg.Listen)
	}
	return n
}

// The DaemonSet's liveness probe and scrape annotations ask the agent's
// /healthz and /metrics on the port its ConfigMap makes it listen on.
func TestDaemonSetWatchesTheAgent(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/kubernetes/agent-daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var agentToml string
	var ds map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		switch doc["kind"] {
		case "ConfigMap":
			agentToml, _ = dig(doc, "data", "agent.toml").(string)
		case "DaemonSet":
			ds = doc
		}
	}
	port := listenPort(t, "ConfigMap heft-agent", agentToml)
	if port == 0 {
		t.Fatal("the DaemonSet's agent serves no /healthz: set listen")
	}
	container := dig(ds, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)
	ports := map[string]int{}
	for _, p := range container["ports"].([]any) {
		p := p.(map[string]any)
		ports[p["name"].(string)] = p["containerPort"].(int)
	}
	probe, ok := dig(container, "livenessProbe", "httpGet").(map[string]any)
	if !ok || probe["path"] != "/healthz" {
		t.Fatalf("liveness probe %v, want an httpGet of /healthz", container["livenessProbe"])
	}
	probePort, isNumber := probe["port"].(int)
	if !isNumber {
		probePort = ports[probe["port"].(string)]
	}
	if probePort != port {
		t.Errorf("the liveness probe asks port %d, the agent listens on %d", probePort, port)
	}
	ann := dig(ds, "spec", "template", "metadata", "annotations").(map[string]any)
	if ann["prometheus.io/port"] != strconv.Itoa(port) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v, want port %d and /metrics", ann, port)
	}
}

// The packaged config turns /metrics and /healthz on, on loopback.
func TestPackagedConfigListensOnLoopback(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/config/agent.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	if err := cfg.Parse(string(data)); err != nil {
		t.Fatal(err)
	}
	if host, _, err := net.SplitHostPort(cfg.Listen); err != nil || host != "127.0.0.1" {
		t.Errorf("listen %q, want 127.0.0.1:PORT", cfg.Listen)
	}
}

// systemd restarts a stuck agent: the unit waits for READY=1 and keeps a
// watchdog the agent feeds every half interval while it is not stuck.
func TestAgentUnitWatchdog(t *testing.T) {
	keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-agent.service"))
	for k, v := range map[string]string{"Type": "notify", "NotifyAccess": "main", "Restart": "on-failure"} {
		if got := keys[k]; len(got) == 0 || got[len(got)-1] != v {
			t.Errorf("%s = %v, want %s", k, got, v)
		}
	}
	if got := keys["WatchdogSec"]; len(got) != 1 || got[0] == "0" {
		t.Errorf("WatchdogSec = %v, want one", got)
	}
}
