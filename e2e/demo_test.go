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
	demo := exec.Command(filepath.Join(bin, "demo"), "--bin", bin, "--listen", "127.0.0.1:0", "--until-settled", "--timeout", "150s")
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
