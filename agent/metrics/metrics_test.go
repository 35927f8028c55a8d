package metrics

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"heft/shared/testutil"
	"heft/shared/wire"
)

const gib = 1 << 30

// fixedState is a GPU node in a known state: two H100s as go-nvml's DGX
// H100 mock describes them in agent/gpu's tests (1755 of 1980 MHz, 60 of
// 80 GiB free, 97 % busy, held back by the software power cap and a
// hardware slowdown), the second one refusing utilisation and clock
// reasons as some boards do; a vLLM engine that is up with its log read
// and four probes behind it, and an SGLang engine that is down.
func fixedState() State {
	h100 := func(i int) wire.GPU {
		return wire.GPU{Index: i, UUID: "GPU-00000000-0000-0000-0000-00000000000" + string(rune('0'+i)), Name: "NVIDIA H100 80GB HBM3",
			MemoryTotal: 80 * gib, MemoryFree: 60 * gib, MemoryUsed: 19*gib + gib/2, SMClockMHz: 1755, SMClockMaxMHz: 1980,
			ClockEventReasons: []string{"sw_power_cap", "hw_slowdown"}, UtilizationPercent: 97}
	}
	refusing := h100(1)
	refusing.ClockEventReasons, refusing.UtilizationPercent = nil, 0
	refusing.Unsupported = []string{"clock_event_reasons", "utilization_percent"}
	return State{
		Node: "gpu-a", Version: "0.2.0+test", Connected: true,
		GPUs: []wire.GPU{h100(0), refusing},
		Engines: []Engine{
			{Kind: "vllm", URL: "http://127.0.0.1:8000", Up: true, Log: "/var/log/vllm/server.log", LogLines: 1234,
				Probes: map[string]int64{OutcomeMeasured: 3, wire.CodeProbeFailed: 1}},
			{Kind: "sglang", URL: "http://127.0.0.1:30000"},
		},
	}
}

func scrape(t *testing.T, s State) []byte {
	t.Helper()
	srv := httptest.NewServer(Handler(func() State { return s }, nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b.String())
	}
	return b.Bytes()
}

// The exposition of a fixed state, byte for byte (go test -update after
// an intended change; review the diff).
func TestExpositionGolden(t *testing.T) {
	testutil.Golden(t, filepath.Join("testdata", "golden", "metrics.txt"), scrape(t, fixedState()))
}

// Every metric the agent exports is one packaging/prometheus/metrics.yml
// lists for the agent, with exactly its labels and type, and every one it
// lists is exported in the fixed state; read with Prometheus' own parser.
func TestExpositionMatchesTheAgreedList(t *testing.T) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(scrape(t, fixedState())))
	if err != nil {
		t.Fatalf("not a valid exposition: %v", err)
	}
	var agreed struct {
		Agent []struct {
			Name   string   `yaml:"name"`
			Type   string   `yaml:"type"`
			Labels []string `yaml:"labels"`
			Status string   `yaml:"status"`
		} `yaml:"agent"`
	}
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging", "prometheus", "metrics.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &agreed); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range agreed.Agent {
		listed[m.Name] = true
		f, ok := families[m.Name]
		if !ok {
			t.Errorf("%s is listed for the agent but not exported", m.Name)
			continue
		}
		if m.Status != "exists" {
			t.Errorf("%s is exported: mark it exists in metrics.yml", m.Name)
		}
		if got := strings.ToLower(f.GetType().String()); got != m.Type {
			t.Errorf("%s is a %s, listed as a %s", m.Name, got, m.Type)
		}
		for _, s := range f.Metric {
			var labels []string
			for _, l := range s.Label {
				labels = append(labels, l.GetName())
			}
			want := slices.Sorted(slices.Values(m.Labels))
			if !slices.Equal(labels, want) {
				t.Errorf("%s has labels %v, listed %v", m.Name, labels, m.Labels)
				break
			}
		}
	}
	for name := range families {
		if !listed[name] {
			t.Errorf("%s is exported but not listed for the agent in metrics.yml", name)
		}
	}
}

// Nothing from a GPU the agent could not read, and no GPU lines without
// GPUs.
func TestNoGPUs(t *testing.T) {
	s := fixedState()
	s.GPUs = []wire.GPU{{Index: 0, UUID: "GPU-lost", Error: "memory info: nvml: gpu is lost (15)"}}
	out := string(scrape(t, s))
	for _, name := range []string{"heft_gpu_sm_clock_hertz{", "heft_gpu_memory_total_bytes{", "heft_gpu_sm_clock_max_hertz{",
		"heft_gpu_utilization_ratio{", "heft_gpu_clock_event_reason{"} {
		if strings.Contains(out, name) {
			t.Errorf("a lost GPU exports %s", name)
		}
	}
	s.GPUs, s.Connected = nil, false
	out = string(scrape(t, s))
	if strings.Contains(out, "heft_gpu_") || !strings.Contains(out, `heft_agent_coordinator_connected{node="gpu-a"} 0`) {
		t.Errorf("exposition:\n%s", out)
	}
}

// A label value that is not UTF-8 (a Latin-1 log file name that discover
// finds through /proc) is written with U+FFFD in its place: it used to
// stop the scrape at that series, dropping every later engine's while the
// page still answered 200.
func TestLabelsThatAreNotUTF8(t *testing.T) {
	read := func() State {
		return State{Node: "n1", Version: "v", Engines: []Engine{
			{Kind: "vllm", URL: "http://127.0.0.1:8000", Log: "/var/log/vllm-caf\xe9.log", LogLines: 3},
			{Kind: "sglang", URL: "http://127.0.0.1:30000", Log: "/var/log/sglang.log", LogLines: 5},
		}}
	}
	srv := httptest.NewServer(Handler(read, nil))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"log=\"/var/log/vllm-caf\ufffd.log\"", `heft_agent_engine_log_lines_total{kind="sglang"`, `heft_agent_probes_total{kind="sglang"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the scrape lacks %s:\n%s", want, body)
		}
	}
}
