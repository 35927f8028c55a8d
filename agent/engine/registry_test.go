package engine

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"heft/shared/wire"
)

// The registry and the protocol know the same kinds: a kind the agent
// reads but the coordinator refuses (or the reverse) is a half-added kind.
func TestRegistryMatchesWire(t *testing.T) {
	var names []string
	for _, d := range registry {
		names = append(names, d.name)
	}
	if !reflect.DeepEqual(sorted(names), sorted(wire.EngineKinds)) {
		t.Fatalf("registry %v, wire %v", names, wire.EngineKinds)
	}
	fallbacks := 0
	for _, d := range registry {
		if d.port <= 0 || d.health == "" || d.adapter == nil || len(d.programs) == 0 {
			t.Errorf("%s: incomplete descriptor %+v", d.name, d)
		}
		if d.output.Exact && d.output.Fields == nil || d.prefill.Exact && d.prefill.Fields == nil {
			t.Errorf("%s: exact output with no fields to ask for it", d.name)
		}
		if tok := d.tokenize; tok != nil && (tok.Path == "" || tok.Body == nil || tok.Count == nil) {
			t.Errorf("%s: incomplete tokenizer %+v", d.name, tok)
		}
		if len(d.detect.probes) == 0 && d.detect.ownedBy == "" && !d.detect.fallback {
			t.Errorf("%s: Detect cannot recognise it", d.name)
		}
		if d.detect.fallback {
			fallbacks++
			if d != registry[len(registry)-1] {
				t.Errorf("%s: the fallback kind must come last", d.name)
			}
		}
	}
	if fallbacks > 1 {
		t.Errorf("%d fallback kinds: Detect could not tell them apart", fallbacks)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestOutputFor(t *testing.T) {
	for _, tt := range []struct {
		kind   string
		exact  bool
		fields map[string]any
	}{
		{wire.EngineVLLM, true, map[string]any{"min_tokens": 8, "ignore_eos": true}},
		{wire.EngineSGLang, true, map[string]any{"min_tokens": 8, "ignore_eos": true}},
		{wire.EngineLlamaCpp, true, map[string]any{"n_predict": 8, "ignore_eos": true}},
		{wire.EngineMLX, false, nil},
		{wire.EngineOllama, false, nil},
		{"", true, map[string]any{"min_tokens": 8, "n_predict": 8, "ignore_eos": true}},
	} {
		f, err := OutputFor(tt.kind)
		if err != nil {
			t.Fatalf("%q: %v", tt.kind, err)
		}
		var got map[string]any
		if f.Fields != nil {
			got = f.Fields(8)
		}
		if f.Exact != tt.exact || !reflect.DeepEqual(got, tt.fields) {
			t.Errorf("%q: exact %v fields %v; want %v %v", tt.kind, f.Exact, got, tt.exact, tt.fields)
		}
	}
	if _, err := OutputFor("VLLM"); err == nil || !strings.Contains(err.Error(), "not one of") {
		t.Errorf("unknown kind: %v", err)
	}
}

func TestDefaultPorts(t *testing.T) {
	ports := DefaultPorts()
	seen := map[string]int{}
	for _, p := range ports {
		for _, k := range p.Kinds {
			seen[k] = p.Port
		}
	}
	for _, d := range registry {
		if seen[d.name] != d.port {
			t.Errorf("%s on port %d, want %d", d.name, seen[d.name], d.port)
		}
	}
	// The kinds heft began with, in the order inspect tries them.
	want := []Port{
		{8000, []string{"vllm"}},
		{30000, []string{"sglang"}},
		{8080, []string{"llamacpp", "mlx"}},
		{11434, []string{"ollama"}},
	}
	if len(ports) < len(want) || !reflect.DeepEqual(ports[:len(want)], want) {
		t.Errorf("DefaultPorts = %v, want it to start with %v", ports, want)
	}
}

func TestLooksLikeEngine(t *testing.T) {
	for _, tt := range []struct {
		argv []string
		want bool
	}{
		{[]string{"vllm", "serve", "M"}, true},
		{[]string{"/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"}, true},
		{[]string{"python3.11", "-u", "-m", "sglang.launch_server", "--model-path", "M"}, true},
		{[]string{"/opt/llama.cpp/bin/llama-server", "-m", "x.gguf"}, true},
		{[]string{"/Users/me/.venv/bin/python3", "/Users/me/.venv/bin/mlx_lm.server", "--model", "M"}, true},
		{[]string{"/usr/local/bin/ollama", "serve"}, true},
		{[]string{"heft-sim", "--flavor", "vllm"}, true},
		{[]string{"docker-proxy", "-proto", "tcp", "-host-port", "8000"}, false},
		{[]string{"python3", "serve.py", "--model", "M"}, false},
		{[]string{"nginx: worker process"}, false},
		{nil, false},
	} {
		if got := looksLikeEngine(tt.argv); got != tt.want {
			t.Errorf("looksLikeEngine(%q) = %v", tt.argv, got)
		}
	}
	if launchesEngine([]string{"/usr/local/bin/ollama"}) {
		t.Error("launchesEngine: a bare program name has no arguments to read")
	}
}
