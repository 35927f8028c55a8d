package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"heft/agent/cli"
	"heft/shared/health"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func poolsRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = cli.Main(append([]string{"pools"}, args...), strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// Uneven pools are a CRITICAL finding: the output is whole and the exit
// is 2, as inspect's, so a script can act on it.
func TestPoolsJSONUneven(t *testing.T) {
	code, out, errOut := poolsRun("--engine", "sglang", "--log", testutil.Testdata(t, "logs/sglang-dp2-uneven.log"), "--json")
	if code != 2 || errOut != "" {
		t.Fatalf("exit %d, want 2 (CRITICAL); stderr %q", code, errOut)
	}
	const contract = `{"engine":"sglang","ranks":[{"dp_rank":0,"kv_tokens":24094},{"dp_rank":1,"kv_tokens":2925}],"min_over_max":0.1214,`
	if !strings.HasPrefix(out, contract) || strings.Count(out, "\n") != 1 {
		t.Fatalf("output does not start with the contract:\n%s", out)
	}
	var got struct {
		Engine     string            `json:"engine"`
		Ranks      []wire.Rank       `json:"ranks"`
		MinOverMax float64           `json:"min_over_max"`
		Format     string            `json:"format"`
		Model      string            `json:"model"`
		Ready      bool              `json:"ready"`
		LaunchArgs map[string]string `json:"launch_args"`
		Warning    *health.Finding   `json:"warning"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Format != "sglang-max-total" || got.Model != "Qwen/Qwen3-8B" || !got.Ready || got.LaunchArgs["dp_size"] != "2" {
		t.Errorf("extras = %+v", got)
	}
	if got.Warning == nil || got.Warning.Code != wire.CodeDPPoolImbalance || got.Warning.Severity != wire.SeverityCritical {
		t.Errorf("warning = %+v", got.Warning)
	}
}

func TestPoolsJSONOneRank(t *testing.T) {
	code, out, _ := poolsRun("-engine=vllm", "-log="+testutil.Testdata(t, "engines/vllm-single.log"), "-json")
	if code != 0 || !strings.HasPrefix(out, `{"engine":"vllm","ranks":[{"dp_rank":0,"kv_tokens":379088}],"min_over_max":1,`) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if strings.Contains(out, `"warning"`) || !strings.Contains(out, `"api_key":"***"`) {
		t.Errorf("output:\n%s", out)
	}
}

func TestPoolsTableUneven(t *testing.T) {
	code, out, errOut := poolsRun("--engine", "sglang", "--log", testutil.Testdata(t, "logs/sglang-dp2-uneven.log"))
	if code != 2 || errOut != "" {
		t.Fatalf("exit %d, want 2 (CRITICAL); stderr %q", code, errOut)
	}
	warning := health.Pools([]wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}, health.DefaultThresholds())
	for _, want := range []string{
		"engine       sglang", "model        Qwen/Qwen3-8B",
		"DP rank  KV tokens  of largest",
		"      0     24,094      100.0%",
		"      1      2,925       12.1%",
		"smallest/largest: 0.1214",
		"CRITICAL dp_pool_imbalance: " + warning.Message,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPoolsTableEvenAndRestart(t *testing.T) {
	code, out, _ := poolsRun("--engine", "vllm", "--log", testutil.Testdata(t, "engines/vllm-dp2.log"))
	if code != 0 || !strings.Contains(out, "373,696") || !strings.Contains(out, "373,552") ||
		!strings.Contains(out, "the data-parallel pools are even") || strings.Contains(out, "dp_pool_imbalance") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	code, out, _ = poolsRun("--engine", "sglang", "--log", testutil.Testdata(t, "logs/sglang-restart.log"))
	if code != 0 || !strings.Contains(out, "2 in this log; the pools are the last one's") || !strings.Contains(out, "24,101") || strings.Contains(out, "2,925") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func TestPoolsErrors(t *testing.T) {
	noPool := testutil.Testdata(t, "logs/vllm-no-pool.log")
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr []string
	}{
		{"no pool line", []string{"--engine", "vllm", "--log", noPool}, 1,
			[]string{"no KV pool line found", `"GPU KV cache size: N tokens"`, `"# cuda blocks: N`, "version 0.28.0"}},
		{"no pool line, json", []string{"--engine", "vllm", "--log", noPool, "--json"}, 1, []string{"no KV pool line found"}},
		{"no pool line of any kind", []string{"--log", noPool}, 1,
			[]string{"no KV pool line found", `"GPU KV cache size: N tokens"`, `"KV Cache is allocated. #tokens: N"`, `"max_total_num_tokens=N"`, "N cells"}},
		{"wrong engine", []string{"--engine", "vllm", "--log", testutil.Testdata(t, "engines/sglang-dp2-even.log")}, 1, []string{`try engine "sglang"`}},
		{"unknown engine", []string{"--engine", "tgi", "--log", noPool}, 2, []string{`unknown engine "tgi"`}},
		{"an engine without a pool", []string{"--engine", "mlx", "--log", noPool}, 1, []string{"exposes no KV pool"}},
		// Without --engine a log of no kind's pool lines was read as a
		// vLLM log without one, mlx_lm.server's too.
		{"mlx_lm.server's log, no engine named", []string{"--log", testutil.Testdata(t, "engines/wild/mlx-lm-2026-server-start.log")}, 1,
			[]string{"the log is mlx_lm.server's", "exposes no KV pool"}},
		{"missing file", []string{"--engine", "sglang", "--log", filepath.Join(t.TempDir(), "absent.log")}, 1, []string{"cannot read the log", "absent.log"}},
		{"a directory", []string{"--engine", "sglang", "--log", t.TempDir()}, 1, []string{"is a directory"}},
		{"missing flags", []string{"--engine", "vllm"}, 2, []string{"--log is required", "usage: heft-agent pools"}},
		{"bad flag", []string{"--nope"}, 2, []string{"unknown flag: --nope", "usage: heft-agent pools"}},
		{"extra argument", []string{"--engine", "vllm", "--log", noPool, "extra"}, 2, []string{`unexpected argument "extra"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := poolsRun(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut)
			}
			if out != "" {
				t.Errorf("stdout = %q, want nothing", out)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
		})
	}
	// Help goes to stdout, as on every heft command.
	if code, out, errOut := poolsRun("--help"); code != 0 || errOut != "" ||
		!strings.Contains(out, "usage: heft-agent pools [--engine vllm|sglang|llamacpp|ollama|mlx] --log FILE [--json]") || !strings.Contains(out, "--log SOURCE") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// A CRI-wrapped log (a Kubernetes pod's) gives the raw log's pools.
func TestPoolsWrappedLogs(t *testing.T) {
	code, out, errOut := poolsRun("--engine", "sglang", "--log", testutil.Testdata(t, "wrapped/sglang-dp2-uneven.cri.log"), "--json")
	const contract = `{"engine":"sglang","ranks":[{"dp_rank":0,"kv_tokens":24094},{"dp_rank":1,"kv_tokens":2925}],"min_over_max":0.1214,"complete":true,"expected_ranks":2,`
	if code != 2 || errOut != "" || !strings.HasPrefix(out, contract) {
		t.Fatalf("exit %d (want 2: CRITICAL), stderr %q:\n%s", code, errOut, out)
	}
	var got struct {
		Warning *health.Finding `json:"warning"`
		Source  struct {
			Kind, Wrapper string
			Lines         int
		} `json:"source"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Warning == nil || got.Warning.Code != wire.CodeDPPoolImbalance || got.Source.Wrapper != "cri" || got.Source.Kind != "file" || got.Source.Lines != 34 {
		t.Fatalf("extras %+v", got)
	}

	// The DP4 log with one starved rank reads as four ranks, not one.
	code, out, _ = poolsRun("--engine", "vllm", "--log", testutil.Testdata(t, "wrapped/vllm-dp4-starved.cri.log"))
	for _, want := range []string{"      3     46,704       12.5%", "smallest/largest: 0.1250", "CRITICAL dp_pool_imbalance", "cri wrapper"} {
		if code != 2 || !strings.Contains(out, want) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, want, out)
		}
	}
}

// A set with a rank missing is never "even", and its min_over_max is 0.
func TestPoolsIncomplete(t *testing.T) {
	log := testutil.Testdata(t, "logs/vllm-dp4-starting.log")
	code, out, errOut := poolsRun("--engine", "vllm", "--log", log, "--json")
	const contract = `{"engine":"vllm","ranks":[{"dp_rank":0,"kv_tokens":373696},{"dp_rank":1,"kv_tokens":373552},{"dp_rank":2,"kv_tokens":373600}],"min_over_max":0,"complete":false,"expected_ranks":4,"missing_ranks":[3],`
	if code != 0 || errOut != "" || !strings.HasPrefix(out, contract) {
		t.Fatalf("exit %d, stderr %q:\n%s", code, errOut, out)
	}
	var got struct {
		Warning  *health.Finding `json:"warning"`
		Warnings []health.Finding
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Warning == nil || got.Warning.Code != wire.CodePoolsIncomplete || len(got.Warnings) != 1 ||
		!strings.Contains(got.Warning.Message, "none from DP 3") || !strings.Contains(got.Warning.Message, "data_parallel_size=4") {
		t.Fatalf("warnings %+v", got.Warnings)
	}

	code, out, _ = poolsRun("--engine", "vllm", "--log", log)
	if code != 0 || strings.Contains(out, "even") || strings.Contains(out, "0.99") ||
		!strings.Contains(out, "smallest/largest: unknown: 3 of 4 data-parallel ranks printed a pool") ||
		!strings.Contains(out, "WARNING pools_incomplete: expected 4 data-parallel ranks") || strings.Contains(out, "note: expected") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	// Complete sets say so.
	code, out, _ = poolsRun("--engine", "vllm", "--log", testutil.Testdata(t, "engines/vllm-dp2.log"), "--json")
	if code != 0 || !strings.Contains(out, `"min_over_max":0.9996,"complete":true,"expected_ranks":2,"format"`) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// --log takes every source spec: a glob, and sources that cannot be read
// here fail with exit 1 and a message naming the source.
func TestPoolsSourceSpecs(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile(testutil.Testdata(t, "logs/sglang-dp2-uneven.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sglang-1.log"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := poolsRun("--engine", "sglang", "--log", filepath.Join(dir, "sglang-*.log"), "--json")
	if code != 2 || !strings.Contains(out, `"kv_tokens":2925`) || !strings.Contains(out, `"kind":"glob"`) {
		t.Fatalf("glob: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	tests := []struct {
		log    string
		code   int
		stderr []string
	}{
		{filepath.Join(dir, "vllm-*.log"), 1, []string{"cannot read the log", "no file matches"}},
		{"k8s:heft-test/absent-pod/engine", 1, []string{"cannot read the log", "k8s:"}},
		{"docker:heft-test-absent-container", 1, []string{"cannot read the log", "docker"}},
		{"journal:vllm", 2, []string{`unknown kind "journal:"`}},
		{"k8s:default/vllm", 2, []string{"NAMESPACE/POD/CONTAINER"}},
	}
	for _, tc := range tests {
		code, out, errOut := poolsRun("--engine", "sglang", "--log", tc.log)
		if code != tc.code || out != "" {
			t.Errorf("%s: exit %d (want %d), stdout %q", tc.log, code, tc.code, out)
		}
		for _, want := range tc.stderr {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s: stderr lacks %q:\n%s", tc.log, want, errOut)
			}
		}
	}
}

// Without --engine the log's own kind is found; llama.cpp and Ollama logs
// give their one pool.
func TestPoolsEveryKind(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log", testutil.Testdata(t, "engines/sglang-dp2-even.log"), "--json"}, `"engine":"sglang"`},
		{[]string{"--log", testutil.Testdata(t, "engines/wild/llamacpp-server-2024.log"), "--json"}, `"ranks":[{"dp_rank":0,"kv_tokens":512}]`},
		{[]string{"--engine", "ollama", "--log", testutil.Testdata(t, "engines/wild/ollama-2024-n-ctx.log"), "--json"}, `"ranks":[{"dp_rank":0,"kv_tokens":128}]`},
	} {
		code, out, errOut := poolsRun(tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, stdout %s, stderr %s", tc.args, code, out, errOut)
		}
	}
}
