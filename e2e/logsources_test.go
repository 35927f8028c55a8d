package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/agent/logwrap/wraptest"
	"heft/shared/view"
	"heft/shared/wire"
	"heft/sim"
)

// podsRoot is a scratch /var/log/pods: the kubelet's folders, written as
// the container runtime writes them.
type podsRoot string

// wrap writes a sim's raw start-up log into pod NS/POD's container log as
// containerd does (CRI lines, each longer than split bytes in "P" chunks
// ended by an "F"), leaving out the raw lines drop says to.
func (r podsRoot) wrap(t *testing.T, rawPath, ns, pod, container string, split int, drop func(string) bool) string {
	t.Helper()
	raw, err := os.ReadFile(rawPath)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		if drop == nil || !drop(l) {
			lines = append(lines, l)
		}
	}
	path := filepath.Join(string(r), ns+"_"+pod+"_0d1e2f30-4152-6374-8596-a7b8c9d0e1f2", container, "0.log")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	text := wraptest.CRI(lines, time.Now().Add(-time.Minute), split)
	if !strings.Contains(text, " P ") {
		t.Fatalf("no line of %s was split: the test would not exercise P/F joining", rawPath)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Agents that read their engines' logs from a Kubernetes node's pod logs,
// CRI-wrapped with split lines, reporting to a real coordinator: the
// starved rank is held exactly as from the raw log, a rank that has not
// printed its pool is an incomplete set (a warning, no ratio, never
// "even"), and a log whose pools the engine's metrics contradict says so
// with both figures.
func TestPoolsFromPodLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := startCoordinator(t, filepath.Join(dir, "state"), "127.0.0.1:0")
	pods := podsRoot(filepath.Join(dir, "pods"))
	extra := fmt.Sprintf("[engine_logs]\npods_root = %q\n", string(pods))
	agentURL := "ws://" + c.addr + "/api/v1/agent"
	starved := []int64{373696, 373552, 373600, 46704}
	simCfg := func(flavor string, pools []int64, logPath string) sim.Config {
		return sim.Config{Flavor: flavor, Model: model, SingleTPS: 200, Batch16TPS: 1600, DP: len(pools), KVTokens: pools, LogPath: logPath}
	}

	// The same DP4 engine twice: one agent reads the raw log, the other the
	// pod's CRI log.
	rawLog := filepath.Join(dir, "raw.log")
	raw := startSim(t, simCfg(sim.FlavorVLLM, starved, rawLog), "127.0.0.1:0")
	startAgentWith(t, agentURL, extra, "gpu-raw", "vllm", raw.URL(), rawLog)
	podLog := filepath.Join(dir, "pod.log")
	pod := startSim(t, simCfg(sim.FlavorVLLM, starved, podLog), "127.0.0.1:0")
	pods.wrap(t, podLog, "inference", "vllm-0", "vllm", 100, nil)
	startAgentWith(t, agentURL, extra, "gpu-pod", "vllm", pod.URL(), "k8s:inference/vllm-0/vllm")

	// Rank 3 of this one has not printed its pool yet.
	startingLog := filepath.Join(dir, "starting.log")
	starting := startSim(t, simCfg(sim.FlavorVLLM, starved, startingLog), "127.0.0.1:0")
	pods.wrap(t, startingLog, "inference", "vllm-1", "vllm", 100, func(l string) bool {
		return strings.Contains(l, "EngineCore_DP3") && strings.Contains(l, "GPU KV cache size")
	})
	startAgentWith(t, agentURL, extra, "gpu-starting", "vllm", starting.URL(), "k8s:inference/vllm-1/vllm")

	// An SGLang pod whose log is another run's: its metrics say rank 1
	// holds 2,925 tokens, its log 24,094.
	otherLog := filepath.Join(dir, "other.log")
	cfg := simCfg(sim.FlavorSGLang, []int64{24094, 2925}, otherLog)
	cfg.Faults.LogKVTokens = []int64{24094, 24094}
	other := startSim(t, cfg, "127.0.0.1:0")
	pods.wrap(t, otherLog, "inference", "sglang-0", "sglang", 80, nil)
	startAgentWith(t, agentURL, extra, "gpu-other", "sglang", other.URL(), "k8s:inference/sglang-0/sglang")

	ws := c.waitFor(t, "four workers measured", measuredWithin, settled("gpu-raw", "gpu-pod", "gpu-starting", "gpu-other"))
	rw, _ := byNode(ws, "gpu-raw")
	pw, _ := byNode(ws, "gpu-pod")
	sw, _ := byNode(ws, "gpu-starting")
	ow, _ := byNode(ws, "gpu-other")

	t.Run("held from the pod log exactly as from the raw log", func(t *testing.T) {
		for _, w := range []view.Worker{rw, pw} {
			if w.State != view.StateHeld {
				t.Fatalf("%s: %s, want held; warnings %+v", w.Node, w.State, w.Warnings)
			}
			if len(w.Ranks) != 4 || w.Ranks[3].KVTokens != 46704 || w.Complete == nil || !*w.Complete || *w.ExpectedRanks != 4 {
				t.Fatalf("%s: ranks %+v complete %v expected %v", w.Node, w.Ranks, w.Complete, w.ExpectedRanks)
			}
		}
		rx, _ := hasWarning(rw, wire.CodeDPPoolImbalance)
		px, ok := hasWarning(pw, wire.CodeDPPoolImbalance)
		if !ok || px.Severity != wire.SeverityCritical || !strings.Contains(px.Message, "rank 3 only 46,704") {
			t.Fatalf("pod log: %+v", pw.Warnings)
		}
		if px.Message != rx.Message || *pw.PoolRatio != *rw.PoolRatio {
			t.Errorf("the pod log's verdict differs from the raw log's:\n%s (%v)\n%s (%v)", px.Message, *pw.PoolRatio, rx.Message, *rw.PoolRatio)
		}
		if l := pw.LogSource; l == nil || l.Spec != "k8s:inference/vllm-0/vllm" || l.Wrapper != "cri" || l.Error != "" ||
			!strings.HasPrefix(l.Resolved, string(pods)) {
			t.Errorf("log source %+v", pw.LogSource)
		}
	})
	t.Run("a rank missing is incomplete, not even", func(t *testing.T) {
		if sw.State != view.StateAdmitted {
			t.Fatalf("state %s, want admitted: an incomplete set is a warning, not a hold; warnings %+v", sw.State, sw.Warnings)
		}
		x, ok := hasWarning(sw, wire.CodePoolsIncomplete)
		if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "none from DP 3") {
			t.Fatalf("warnings %+v", sw.Warnings)
		}
		if sw.PoolRatio != nil || sw.Complete == nil || *sw.Complete || sw.ExpectedRanks == nil || *sw.ExpectedRanks != 4 ||
			len(sw.MissingRanks) != 1 || sw.MissingRanks[0] != 3 || len(sw.Ranks) != 3 {
			t.Errorf("ratio %v complete %v expected %v missing %v ranks %+v", sw.PoolRatio, sw.Complete, sw.ExpectedRanks, sw.MissingRanks, sw.Ranks)
		}
		for _, w := range sw.Warnings {
			if strings.Contains(w.Message, " are even") || strings.Contains(w.Message, "pools are even") {
				t.Errorf("%s calls the set even: %s", w.Code, w.Message)
			}
		}
	})
	t.Run("log and metrics disagree", func(t *testing.T) {
		x, ok := hasWarning(ow, wire.CodePoolsDisagree)
		if !ok || x.Severity != wire.SeverityWarning || !strings.Contains(x.Message, "rank 1: 24,094 tokens in the log, 2,925 in /metrics") {
			t.Fatalf("warnings %+v", ow.Warnings)
		}
	})
}
