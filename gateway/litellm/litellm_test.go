package litellm_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gopkg.in/yaml.v3"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/litellm"
	"heft/gateway/target"
	"heft/shared/view"
)

const model = "Qwen/Qwen3-8B"

// file is the part of LiteLLM's config heft-sync writes, read back the way
// LiteLLM reads it.
type file struct {
	ModelList []struct {
		ModelName     string         `yaml:"model_name"`
		LiteLLMParams map[string]any `yaml:"litellm_params"`
	} `yaml:"model_list"`
}

func read(t *testing.T, path string) file {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f file
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	return f
}

func TestModelListAndCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "heft-models.yaml")
	marker := filepath.Join(dir, "ran")
	f, err := litellm.NewFile(path, []string{"sh", "-c", "echo x >> " + marker}, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	qwen, err := f.Target(litellm.Config{Model: model, ModelName: "qwen"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.Target(litellm.Config{Model: "other", Provider: "openai", APIKey: "os.environ/OTHER_KEY"})
	if err != nil {
		t.Fatal(err)
	}
	w2 := gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 0.63)
	mc := 32
	w2.MaxConcurrency = &mc
	m, _ := target.ForModel(model, []coord.Worker{
		gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1.37), w2,
		gwtest.Worker(model, "10.0.0.3:8000", view.StateHeld, 0),
	})
	res, err := qwen.Apply(context.Background(), m)
	if err != nil || res.Serving != 2 || len(res.Changes) != 2 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	om, _ := target.ForModel("other", []coord.Worker{gwtest.Worker("other", "10.0.0.9:9000", view.StateAdmitted, 1)})
	if _, err := other.Apply(context.Background(), om); err != nil {
		t.Fatal(err)
	}
	got := read(t, path)
	if len(got.ModelList) != 3 {
		t.Fatalf("model_list: %+v", got.ModelList)
	}
	first := got.ModelList[1] // sorted by model_name, then api_base: other, qwen, qwen
	if first.ModelName != "qwen" || first.LiteLLMParams["model"] != "hosted_vllm/"+model ||
		first.LiteLLMParams["api_base"] != "http://10.0.0.1:8000/v1" || first.LiteLLMParams["weight"] != 1.37 {
		t.Fatalf("first qwen deployment: %+v", first)
	}
	if got.ModelList[2].LiteLLMParams["max_parallel_requests"] != 32 || got.ModelList[1].LiteLLMParams["max_parallel_requests"] != nil {
		t.Fatalf("max_parallel_requests: %+v", got.ModelList)
	}
	if o := got.ModelList[0]; o.ModelName != "other" || o.LiteLLMParams["model"] != "openai/other" || o.LiteLLMParams["api_key"] != "os.environ/OTHER_KEY" {
		t.Fatalf("other: %+v", o)
	}
	runs, _ := os.ReadFile(marker)
	if strings.Count(string(runs), "\n") != 2 {
		t.Fatalf("the command ran %d times, want once per change", strings.Count(string(runs), "\n"))
	}
	// Unchanged: no write, no command.
	if res, err := qwen.Apply(context.Background(), m); err != nil || len(res.Changes) != 0 {
		t.Fatalf("unchanged apply: %+v %v", res, err)
	}
	if runs, _ := os.ReadFile(marker); strings.Count(string(runs), "\n") != 2 {
		t.Fatal("the command ran without a change")
	}
}

// A worker with a tiny weight (a weight_min far below 1, a worker kept at
// the gateway's weight before any is measured) keeps its share: three
// decimals wrote 0.0003 as 0, which LiteLLM's simple-shuffle never picks,
// and a model of such workers only fails every request (it divides by the
// weights' sum). Each weight is a plain decimal, which LiteLLM's YAML 1.1
// parser reads as a number: yaml.v3's 1e-05 is a string to it.
func TestTinyWeightsKeepTheirShare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.yaml")
	f, err := litellm.NewFile(path, nil, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	tg, _ := f.Target(litellm.Config{Model: model})
	weights := map[string]float64{"10.0.0.1:8000": 8, "10.0.0.2:8000": 0.0003, "10.0.0.3:8000": 0.00001, "10.0.0.4:8000": 0.0123456}
	var ws []coord.Worker
	for addr, w := range weights {
		ws = append(ws, gwtest.Worker(model, addr, view.StateAdmitted, w))
	}
	m, _ := target.ForModel(model, ws)
	res, err := tg.Apply(context.Background(), m)
	if err != nil || res.Serving != 4 || res.RoundingError > 0.005 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	data, _ := os.ReadFile(path)
	plain := regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "weight: "); ok && !plain.MatchString(v) {
			t.Errorf("weight %q is not a plain decimal:\n%s", v, data)
		}
	}
	got := read(t, path)
	if len(got.ModelList) != 4 {
		t.Fatalf("model_list: %+v", got.ModelList)
	}
	for _, d := range got.ModelList {
		addr := strings.TrimSuffix(strings.TrimPrefix(d.LiteLLMParams["api_base"].(string), "http://"), "/v1")
		var w float64
		switch v := d.LiteLLMParams["weight"].(type) {
		case int: // 8: an integer to YAML, and to LiteLLM
			w = float64(v)
		case float64:
			w = v
		}
		if ratio := w / weights[addr]; !(w > 0) || ratio < 0.995 || ratio > 1.005 {
			t.Errorf("%s: weight %v, want %v within 0.5 %%", addr, d.LiteLLMParams["weight"], weights[addr])
		}
	}
}

func TestCommandFailureIsRetried(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "fail")
	os.WriteFile(flag, nil, 0o644)
	f, err := litellm.NewFile(filepath.Join(dir, "m.yaml"), []string{"sh", "-c", "test ! -e " + flag}, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	tg, _ := f.Target(litellm.Config{Model: model})
	m, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)})
	if _, err := tg.Apply(context.Background(), m); target.Reason(err) != target.ReasonCommand {
		t.Fatalf("first apply: %v", err)
	}
	os.Remove(flag)
	if res, err := tg.Apply(context.Background(), m); err != nil || len(res.Changes) != 1 {
		t.Fatalf("retry: %+v %v", res, err)
	}
}

// A command that fails after a change puts the last good file back, so a
// heft-sync restarted before the retry, which remembers nothing of the
// failure, still writes the change and runs the command. Every failure of
// a streak does: when only the first did, a heft-sync restarted after the
// second found the new file and never ran the command.
func TestCommandFailureSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	path, flag, ran := filepath.Join(dir, "m.yaml"), filepath.Join(dir, "fail"), filepath.Join(dir, "ran")
	command := []string{"sh", "-c", "test ! -e " + flag + " && touch " + ran}
	open := func() target.Target {
		f, err := litellm.NewFile(path, command, 0, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		tg, _ := f.Target(litellm.Config{Model: model})
		return tg
	}
	one := []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)}
	two := append(one, gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1))
	apply := func(tg target.Target, ws []coord.Worker) error {
		m, _ := target.ForModel(model, ws)
		_, err := tg.Apply(context.Background(), m)
		return err
	}
	if err := apply(open(), one); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	os.WriteFile(flag, nil, 0o644)
	failing := open()
	for i := range 2 { // a streak of failures
		if err := apply(failing, two); target.Reason(err) != target.ReasonCommand {
			t.Fatalf("apply %d, whose command fails: %v", i, err)
		}
		if after, _ := os.ReadFile(path); string(after) != string(before) {
			t.Errorf("after failed command %d the file is\n%s\nwant the last good one\n%s", i, after, before)
		}
	}
	os.Remove(flag)
	os.Remove(ran)
	if err := apply(open(), two); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatal("the restarted heft-sync did not run the command")
	}
	if got := len(read(t, path).ModelList); got != 2 {
		t.Fatalf("%d deployments, want 2", got)
	}
}

// A command that keeps failing is run at every sync, and after each
// failure the file is the last good one, what LiteLLM runs.
func TestCommandThatKeepsFailingKeepsTheLastGoodFile(t *testing.T) {
	dir := t.TempDir()
	path, tries := filepath.Join(dir, "m.yaml"), filepath.Join(dir, "tries")
	ok, err := litellm.NewFile(path, nil, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ok.Target(litellm.Config{Model: model})
	one, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)})
	if _, err := first.Apply(context.Background(), one); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	f, err := litellm.NewFile(path, []string{"sh", "-c", "echo >> " + tries + "; false"}, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	tg, _ := f.Target(litellm.Config{Model: model})
	two, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1),
		gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1)})
	for i := range 4 {
		if _, err := tg.Apply(context.Background(), two); target.Reason(err) != target.ReasonCommand {
			t.Fatalf("apply %d: %v", i, err)
		}
		if data, _ := os.ReadFile(path); string(data) != string(before) {
			t.Fatalf("after failed command %d the file is\n%s\nwant the last good one\n%s", i, data, before)
		}
	}
	if data, _ := os.ReadFile(tries); strings.Count(string(data), "\n") != 4 {
		t.Fatalf("the command ran %d times in 4 applies, want 4", strings.Count(string(data), "\n"))
	}
}

func TestNewFileRefusesBadPaths(t *testing.T) {
	for _, p := range []string{"relative.yaml", "/no/such/folder/x.yaml"} {
		if _, err := litellm.NewFile(p, nil, 0, hclog.NewNullLogger()); err == nil {
			t.Errorf("NewFile(%q) took it", p)
		}
	}
}

// Two tables of one model, its decode and its prefill backend under two
// names, share a file without writing over each other, and every
// deployment carries what its worker can hold.
func TestPrefillBackendBesideDecode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heft-models.yaml")
	f, err := litellm.NewFile(path, nil, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	decode, err := f.Target(litellm.Config{Model: model, ModelName: "qwen"})
	if err != nil {
		t.Fatal(err)
	}
	long, err := f.Target(litellm.Config{Model: model, ModelName: "qwen-long"})
	if err != nil {
		t.Fatal(err)
	}
	fast, slow := gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1.35), gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 0.65)
	p1, p2, c1, c2 := 0.41, 1.59, int64(40960), int64(2925)
	fast.PrefillWeight, slow.PrefillWeight, fast.MaxContextTokens, slow.MaxContextTokens = &p1, &p2, &c1, &c2
	ws := []coord.Worker{fast, slow}
	dm, _ := target.ForModel(model, ws)
	pm, _ := target.ForSelection(model, target.Selection{Kind: view.WeightPrefill}, ws)
	if _, err := decode.Apply(context.Background(), dm); err != nil {
		t.Fatal(err)
	}
	if _, err := long.Apply(context.Background(), pm); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	var got struct {
		ModelList []struct {
			ModelName     string         `yaml:"model_name"`
			LiteLLMParams map[string]any `yaml:"litellm_params"`
			ModelInfo     map[string]any `yaml:"model_info"`
		} `yaml:"model_list"`
	}
	if err := yaml.Unmarshal(data, &got); err != nil || len(got.ModelList) != 4 {
		t.Fatalf("model_list (%v):\n%s", err, data)
	}
	want := []struct {
		name   string
		weight float64
		maxIn  int
	}{{"qwen", 1.35, 40960}, {"qwen", 0.65, 2925}, {"qwen-long", 0.41, 40960}, {"qwen-long", 1.59, 2925}}
	for i, w := range want {
		d := got.ModelList[i]
		if d.ModelName != w.name || d.LiteLLMParams["weight"] != w.weight || d.ModelInfo["max_input_tokens"] != w.maxIn {
			t.Errorf("deployment %d: %+v, want %+v\n%s", i, d, w, data)
		}
	}
}

// heft-sync restarts: the file holds what the last one wrote for two
// tables. The first table to apply leaves the other's deployments as they
// are until that table applies (it may never: the coordinator may list no
// worker of its model), and drops those of a name no table writes. Each
// table reads its own deployments back as what LiteLLM serves.
func TestRestartKeepsTheOtherTablesDeployments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "heft-models.yaml")
	const before = `model_list:
  - model_name: qwen
    litellm_params: {model: hosted_vllm/Qwen/Qwen3-8B, api_base: "http://10.0.0.1:8000/v1", weight: 1.5}
  - model_name: qwen
    litellm_params: {model: hosted_vllm/Qwen/Qwen3-8B, api_base: "https://engine-2.internal/v1", weight: 0.5}
  - model_name: other
    litellm_params: {model: hosted_vllm/other, api_base: "http://10.0.0.9:9000/v1", weight: 1}
  - model_name: gone
    litellm_params: {model: hosted_vllm/gone, api_base: "http://10.0.0.8:9000/v1", weight: 1}
`
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := litellm.NewFile(path, nil, 0, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	qwen, _ := f.Target(litellm.Config{Model: model, ModelName: "qwen"})
	other, _ := f.Target(litellm.Config{Model: "other"})
	served, err := qwen.Served(context.Background())
	want := []target.Served{{Address: "10.0.0.1:8000", Weight: 1.5, Owned: true}, {Address: "engine-2.internal:443", Weight: 0.5, Owned: true}}
	if err != nil || !slices.Equal(served, want) {
		t.Fatalf("Served = %+v, %v; want %+v", served, err, want)
	}

	m, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1)})
	if _, err := qwen.Apply(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		var out []string
		for _, d := range read(t, path).ModelList {
			out = append(out, d.ModelName+" "+d.LiteLLMParams["api_base"].(string))
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"other http://10.0.0.9:9000/v1", "qwen http://10.0.0.1:8000/v1"}) {
		t.Fatalf("after qwen's first apply: %q", got)
	}
	om, _ := target.ForModel("other", []coord.Worker{gwtest.Worker("other", "10.0.0.7:9000", view.StateAdmitted, 1)})
	if _, err := other.Apply(context.Background(), om); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"other http://10.0.0.7:9000/v1", "qwen http://10.0.0.1:8000/v1"}) {
		t.Fatalf("after other's first apply: %q", got)
	}
	// A file that cannot be read is written again from heft's state.
	if err := os.WriteFile(path, []byte("model_list: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := qwen.Served(context.Background()); err == nil {
		t.Fatal("Served read a broken file")
	}
	m2, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 2)})
	if _, err := qwen.Apply(context.Background(), m2); err != nil || len(names()) != 2 {
		t.Fatalf("after a broken file: %q, %v", names(), err)
	}
}
