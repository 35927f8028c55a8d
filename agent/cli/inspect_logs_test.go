package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

var inspectT0 = time.Date(2025, 12, 11, 9, 13, 58, 0, time.UTC)

func inspectLines(t *testing.T, rel string) []string {
	t.Helper()
	return strings.Split(strings.TrimRight(string(testutil.ReadTestdata(t, rel)), "\n"), "\n")
}

func inspectWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An agent config whose engine logs to a Kubernetes pod: inspect says
// where it read and how, shows the rank that has no pool yet, and never
// gives a ratio or calls the set even.
func TestInspectPodLog(t *testing.T) {
	s := inspectSim(t, sim.Config{Flavor: sim.FlavorVLLM, DP: 4, KVTokens: []int64{373696, 373552, 373600, 46704}})
	root := t.TempDir()
	live := filepath.Join(root, "inference_vllm-0_5f1c0000-1111-2222-3333-444444444444", "vllm", "0.log")
	inspectWrite(t, live, wraptest.CRI(inspectLines(t, "logs/vllm-dp4-starting.log"), inspectT0, 100))
	cfgPath := filepath.Join(t.TempDir(), "agent.toml")
	inspectWrite(t, cfgPath, fmt.Sprintf("[node]\nname = \"gpu-k8s\"\n[engine_logs]\npods_root = %q\n[[engine]]\nkind = \"vllm\"\nurl = %q\nlog = \"k8s:inference/vllm-0/vllm\"\n",
		root, s.URL()))

	code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--config", cfgPath)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	for _, want := range []string{
		"rank 2: 373,600 tokens", "rank 3: no pool (not printed yet)",
		"smallest/largest unknown: 3 of 4 data-parallel ranks printed a pool (from k8s:inference/vllm-0/vllm)",
		"log          k8s:inference/vllm-0/vllm",
		"read " + live + " (via kubelet pod log folder " + root + ", cri wrapper)",
		"43 engine lines read",
		"WARNING pools_incomplete: expected 4 data-parallel ranks but 3 printed a KV pool; none from DP 3",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, " even") || strings.Contains(out, "smallest/largest 0.") || strings.Contains(out, "smallest/largest 1.") {
		t.Errorf("an incomplete set judged:\n%s", out)
	}

	code, out, _ = inspectWith(t, nil, errNoNVML, nil, "--config", cfgPath, "--json")
	var rep inspectReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	e := rep.Engines[0]
	if e.ExpectedRanks != 4 || e.Complete == nil || *e.Complete || !slices.Equal(e.MissingRanks, []int{3}) || len(e.Ranks) != 3 {
		t.Errorf("ranks %+v expected %d complete %v missing %v", e.Ranks, e.ExpectedRanks, e.Complete, e.MissingRanks)
	}
	if len(rep.Logs) != 1 || rep.Logs[0].Engine != s.URL() || rep.Logs[0].Kind != "k8s" || rep.Logs[0].Resolved != live ||
		rep.Logs[0].Wrapper != logwrap.CRI || rep.Logs[0].Lines != 43 {
		t.Errorf("logs %+v", rep.Logs)
	}
}

// --log as on pools: the one engine's log, any source; a mistake in it
// is a usage error, as is --log for several engines.
func TestInspectLogFlag(t *testing.T) {
	s := inspectSim(t, sim.Config{Flavor: sim.FlavorSGLang, DP: 2, KVTokens: []int64{24094, 2925}})
	wrapped := testutil.Testdata(t, "wrapped/sglang-dp2-uneven.cri.log")
	code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--engine", "sglang="+s.URL(), "--log", wrapped)
	if code != 2 {
		t.Fatalf("exit %d, want 2 for the CRITICAL pools; stderr %s", code, errOut)
	}
	for _, want := range []string{"rank 1: 2,925 tokens", "smallest/largest 0.12 (from " + wrapped + ")", "(via file, cri wrapper)",
		"checked against metrics: agree; rank 0: 24,094, rank 1: 2,925", "CRITICAL dp_pool_imbalance"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--engine", "sglang=" + s.URL(), "--log", "journal:sglang"}, `unknown kind "journal:"`},
		{[]string{"--engine", "sglang=" + s.URL() + ",log=k8s:ns/pod"}, "NAMESPACE/POD/CONTAINER"},
		{[]string{"--engine", "sglang=" + s.URL(), "--engine", "vllm=http://127.0.0.1:1", "--log", wrapped}, "--log names the log of one engine, but 2"},
	} {
		code, _, errOut := inspectWith(t, nil, errNoNVML, nil, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errOut, tc.says)
		}
	}
}

// Bad input in the log, a source that cannot be read, and a log that
// disagrees with the engine's metrics: each is said plainly, and inspect
// still shows everything else it read (exit 0, or 2 for a CRITICAL warning).
func TestInspectLogProblems(t *testing.T) {
	t.Run("garbage between lines", func(t *testing.T) {
		s := inspectSim(t, sim.Config{Flavor: sim.FlavorSGLang, DP: 2, KVTokens: []int64{24094, 2925}})
		path := filepath.Join(t.TempDir(), "sglang.log")
		lines := inspectLines(t, "logs/sglang-dp2-uneven.log")
		inspectWrite(t, path, wraptest.CRI(lines[:10], inspectT0, 100)+"\x00\x01\x02garbage\xff\xfe\x00\n"+
			"2026-03-02T10:16:00Z stderr [2026-03-02 10:15:30 DP1] max_total_num_tokens=7, context_len=40960\n"+
			wraptest.CRI(lines[10:], inspectT0.Add(time.Second), 100))
		code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--engine", "sglang="+s.URL(), "--log", path)
		if code != 2 {
			t.Fatalf("exit %d, want 2 for the CRITICAL pools; stderr %s", code, errOut)
		}
		for _, want := range []string{"rank 1: 2,925 tokens", "skipped 2 lines: 1 binary data, 1 cri line without a P/F tag",
			"last skipped: line", "(cri line without a P/F tag)"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("an unreadable socket", func(t *testing.T) {
		s := inspectSim(t, sim.Config{Flavor: sim.FlavorVLLM, DP: 2})
		notASocket := filepath.Join(t.TempDir(), "docker.sock")
		inspectWrite(t, notASocket, "")
		cfgPath := filepath.Join(t.TempDir(), "agent.toml")
		inspectWrite(t, cfgPath, fmt.Sprintf("[engine_logs]\ndocker_socket = %q\ndocker_root = %q\n[[engine]]\nkind = \"vllm\"\nurl = %q\nlog = \"docker:vllm\"\n",
			notASocket, t.TempDir(), s.URL()))
		code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--config", cfgPath)
		if code != 0 {
			t.Fatalf("exit %d, stderr %s", code, errOut)
		}
		for _, want := range []string{"log          docker:vllm", "ERROR: ", notASocket, "reading the container's log file instead failed too",
			"WARNING pools_unknown: the engine's start-up log (docker:vllm) cannot be read"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("the log and the metrics disagree", func(t *testing.T) {
		logPath := filepath.Join(t.TempDir(), "sglang.log")
		s := inspectSim(t, sim.Config{Flavor: sim.FlavorSGLang, DP: 2, KVTokens: []int64{24094, 2925}, LogPath: logPath,
			Faults: sim.Faults{LogKVTokens: []int64{24094, 24094}}})
		code, out, errOut := inspectWith(t, nil, errNoNVML, nil, "--engine", "sglang="+s.URL(), "--log", logPath, "--json")
		if code != 0 {
			t.Fatalf("exit %d, stderr %s", code, errOut)
		}
		var rep inspectReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(rep.Warnings, func(w inspectWarning) bool { return w.Code == wire.CodePoolsDisagree })
		if i < 0 || !strings.Contains(rep.Warnings[i].Message, "rank 1: 24,094 tokens in the log, 2,925 in /metrics") {
			t.Fatalf("warnings %+v", rep.Warnings)
		}
		if slices.ContainsFunc(rep.Warnings, func(w inspectWarning) bool { return w.Code == wire.CodeDPPoolImbalance }) {
			t.Errorf("the log's even pools were judged uneven: %+v", rep.Warnings)
		}
		_, out, _ = inspectWith(t, nil, errNoNVML, nil, "--engine", "sglang="+s.URL(), "--log", logPath)
		if !strings.Contains(out, "checked against metrics: DISAGREE (see the warnings); rank 0: 24,094, rank 1: 2,925") {
			t.Errorf("output:\n%s", out)
		}
	})
}
