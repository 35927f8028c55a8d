package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDemo runs the README's main job as a newcomer would: build the real
// binaries, start the simulated fleet, and wait until every worker settled
// (three admitted, the uneven one held).
func TestDemo(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the whole demo fleet")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../agent/cmd/heft-agent", "../coordinator/cmd/heft-coordinator",
		"../sim/cmd/heft-sim", "../scripts/demo")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	logs := filepath.Join(t.TempDir(), "logs")
	demo := exec.Command(filepath.Join(bin, "demo"), "--bin", bin, "--listen", "127.0.0.1:0", "--until-settled", "--timeout", "150s", "--logs", logs)
	out, err := demo.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, text)
	}
	for _, want := range []string{"dashboard:  http://127.0.0.1:", "all workers settled"} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q:\n%s", want, text)
		}
	}
	// A one-host fleet shows only what is wrong: its loopback engines are
	// routable there, so no worker carries not_routable.
	if strings.Contains(text, "not_routable") {
		t.Errorf("the demo warns not_routable on a one-host fleet:\n%s", text)
	}
	// The agent token is printed, with a command that adds an agent.
	m := regexp.MustCompile(`agent token: (\S+) \(also in (\S+)\)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("demo output names no agent token:\n%s", text)
	}
	if b, err := os.ReadFile(m[2]); err != nil || strings.TrimSpace(string(b)) != m[1] {
		t.Errorf("token file %s: %q, %v; want the printed token", m[2], b, err)
	}
	if add := regexp.MustCompile(`heft-agent run --coordinator ws://127\.0\.0\.1:\d+/api/v1/agent --token-file \S+ --node `).FindString(text); add == "" {
		t.Errorf("demo output lacks the command that adds an agent:\n%s", text)
	}
	// The logs outlive the demo, and it says where they are.
	if !strings.Contains(text, "logs kept in "+logs) {
		t.Errorf("demo does not say where its logs stay:\n%s", text)
	}
	if _, err := os.Stat(filepath.Join(logs, "coordinator.out")); err != nil {
		t.Errorf("the logs folder did not outlive the demo: %v", err)
	}
	// The last line printed for each node is its settled state.
	last := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		for _, node := range []string{"gpu-a", "gpu-b", "mac-c", "gpu-d"} {
			if strings.Contains(line, "  "+node+" ") {
				last[node] = line
			}
		}
	}
	for node, want := range map[string]string{"gpu-a": "admitted", "gpu-b": "admitted", "mac-c": "admitted", "gpu-d": "held"} {
		if !strings.Contains(last[node], want) {
			t.Errorf("%s ended as %q, want %s", node, last[node], want)
		}
	}
	if !strings.Contains(last["gpu-d"], "dp_pool_imbalance") {
		t.Errorf("gpu-d is not held for its pools: %q", last["gpu-d"])
	}
	// gpu-a decodes fastest, gpu-b reads prompts fastest: the two weights
	// rank them apart.
	weight := func(node, which string) float64 {
		m := regexp.MustCompile(`  ` + which + ` ([0-9.]+)`).FindStringSubmatch(last[node])
		if m == nil {
			t.Errorf("%s: no %s in %q", node, which, last[node])
			return 0
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	if a, b := weight("gpu-a", "weight"), weight("gpu-b", "weight"); a <= b {
		t.Errorf("decode weights gpu-a %v, gpu-b %v: gpu-a decodes faster", a, b)
	}
	if a, b := weight("gpu-a", "prefill weight"), weight("gpu-b", "prefill weight"); a >= b {
		t.Errorf("prefill weights gpu-a %v, gpu-b %v: gpu-b reads prompts faster", a, b)
	}
	t.Logf("demo output:\n%s", text)
}
