package launch

import (
	"reflect"
	"strings"
	"testing"
)

func TestArgsFromCmdline(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want map[string]string
	}{
		{
			name: "vllm serve with positional model and a bare flag",
			argv: []string{"/usr/bin/python3", "/usr/local/bin/vllm", "serve", "Qwen/Qwen3-8B", "--tensor-parallel-size", "2", "--enforce-eager", "--port=8001"},
			want: map[string]string{"model": "Qwen/Qwen3-8B", "tensor-parallel-size": "2", "enforce-eager": "true", "port": "8001"},
		},
		{
			name: "vllm entry point directly, bool flag before the model",
			argv: []string{"vllm", "serve", "--enforce-eager", "Qwen/Qwen3-8B", "--gpu-memory-utilization", "0.90"},
			want: map[string]string{"model": "Qwen/Qwen3-8B", "enforce-eager": "true", "gpu-memory-utilization": "0.90"},
		},
		{
			name: "python -m sglang.launch_server",
			argv: []string{"python3", "-u", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--dp", "2", "--mem-fraction-static", "0.85", "--enable-metrics"},
			want: map[string]string{"model-path": "Qwen/Qwen3-8B", "dp": "2", "mem-fraction-static": "0.85", "enable-metrics": "true"},
		},
		{
			name: "llama-server short flags and a negative value",
			argv: []string{"/opt/llama.cpp/build/bin/llama-server", "-m", "/models/q.gguf", "-c", "8192", "-np", "4", "-ngl", "99", "--seed", "-1", "--metrics"},
			want: map[string]string{"m": "/models/q.gguf", "c": "8192", "np": "4", "ngl": "99", "seed": "-1", "metrics": "true"},
		},
		{
			name: "mlx_lm.server",
			argv: []string{"/Users/me/.venv/bin/python3.12", "/Users/me/.venv/bin/mlx_lm.server", "--model", "mlx-community/Qwen3-8B-4bit", "--port", "8080"},
			want: map[string]string{"model": "mlx-community/Qwen3-8B-4bit", "port": "8080"},
		},
		{
			name: "nargs+ flag keeps every word",
			argv: []string{"vllm", "serve", "M", "--served-model-name", "a", "b", "--max-model-len", "4096"},
			want: map[string]string{"model": "M", "served-model-name": "a b", "max-model-len": "4096"},
		},
		{
			name: "whole line in argv[0] (a launcher's process title)",
			argv: []string{"vllm serve M --dp 2"},
			want: map[string]string{"model": "M", "dp": "2"},
		},
		{
			name: "setproctitle name says nothing",
			argv: []string{"VLLM::APIServer"},
			want: map[string]string{},
		},
		{
			name: "multiprocessing spawn says nothing",
			argv: []string{"python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"},
			want: map[string]string{},
		},
		{
			name: "ollama serve has no flags",
			argv: []string{"/usr/local/bin/ollama", "serve"},
			want: map[string]string{},
		},
		{name: "empty", argv: nil, want: map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FromCmdline(tt.argv)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestNormalizeArgs(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]string
		want []string
	}{
		{
			name: "keys, aliases, numbers, bools, sorting",
			in: map[string]string{"--Tensor-Parallel-Size": "2", "dp": "2", "gpu-memory-utilization": "0.90",
				"enforce-eager": "True", "model_tag": "'Qwen/Qwen3-8B'", "max_model_len": "40960"},
			want: []string{"data_parallel_size=2", "enforce_eager=true", "gpu_memory_utilization=0.9",
				"max_model_len=40960", "model=Qwen/Qwen3-8B", "tensor_parallel_size=2"},
		},
		{
			name: "secrets and noise dropped, port kept",
			in: map[string]string{"api_key": "sk-1", "hf_token": "hf_x", "ssl_keyfile": "/k.pem", "HF-TOKEN": "x",
				"host": "0.0.0.0", "port": "8000", "log_level": "info", "random_seed": "51213", "disable-log-requests": "true",
				"kv_cache_dtype": "fp8", "my_secret_sauce": "1", "db_password": "p"},
			want: []string{"kv_cache_dtype=fp8", "port=8000"},
		},
		{
			name: "None dropped, strings kept",
			in:   map[string]string{"quantization": "None", "context_length": "null", "dtype": "auto", "chat_template": ""},
			want: []string{"chat_template=", "dtype=auto"},
		},
		{
			name: "alias collision is decided by sorted original keys",
			in:   map[string]string{"model": "A", "model_tag": "B"},
			want: []string{"model=A"},
		},
		{name: "empty", in: nil, want: []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Normalize(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// The same launch read from the command line and from vLLM's
// "non-default args" log line normalises to the same arguments.
func TestNormalizeArgsSourcesAgree(t *testing.T) {
	fromCmd := Normalize(FromCmdline([]string{"vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "40960",
		"--gpu-memory-utilization", "0.9", "--data-parallel-size", "2", "--host", "0.0.0.0"}))
	fromLog := Normalize(map[string]string{"model_tag": "Qwen/Qwen3-8B", "host": "0.0.0.0", "model": "Qwen/Qwen3-8B",
		"max_model_len": "40960", "gpu_memory_utilization": "0.9", "data_parallel_size": "2"})
	if !reflect.DeepEqual(fromCmd, fromLog) {
		t.Errorf("cmdline %q\nlog     %q", fromCmd, fromLog)
	}
}

func TestCapacityKey(t *testing.T) {
	args := []string{"data_parallel_size=2", "model=Qwen/Qwen3-8B"}
	k := CapacityKey("gpu-a", "sglang", "Qwen/Qwen3-8B", args)
	if len(k) != 16 {
		t.Fatalf("key %q is not 16 hex digits", k)
	}
	if k != CapacityKey("gpu-a", "sglang", "Qwen/Qwen3-8B", []string{"model=Qwen/Qwen3-8B", "data_parallel_size=2"}) {
		t.Error("argument order changed the key")
	}
	if k != CapacityKey(" gpu-a ", "SGLang", "Qwen/Qwen3-8B", args) {
		t.Error("kind case or node blanks changed the key")
	}
	others := map[string]string{
		"node":  CapacityKey("gpu-b", "sglang", "Qwen/Qwen3-8B", args),
		"kind":  CapacityKey("gpu-a", "vllm", "Qwen/Qwen3-8B", args),
		"model": CapacityKey("gpu-a", "sglang", "Qwen/Qwen3-32B", args),
		"args":  CapacityKey("gpu-a", "sglang", "Qwen/Qwen3-8B", []string{"data_parallel_size=1", "model=Qwen/Qwen3-8B"}),
		// Length prefixes keep shifted boundaries apart.
		"shift": CapacityKey("gpu-as", "glang", "Qwen/Qwen3-8B", args),
	}
	for what, other := range others {
		if other == k {
			t.Errorf("changing the %s kept the key", what)
		}
	}
	if strings.Trim(k, "0123456789abcdef") != "" {
		t.Errorf("key %q is not lower-case hex", k)
	}
}

// The key must not change between runs or releases, or every cached
// measurement is lost on upgrade.
func TestCapacityKeyGolden(t *testing.T) {
	got := CapacityKey("gpu-a", "vllm", "Qwen/Qwen3-8B", []string{"data_parallel_size=2"})
	if want := "e2f093a97ae938ea"; got != want {
		t.Fatalf("capacity key changed: got %s want %s", got, want)
	}
}

func TestProgram(t *testing.T) {
	for _, tt := range []struct {
		argv []string
		want string
	}{
		{[]string{"vllm", "serve", "M"}, "vllm"},
		{[]string{"/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "M"}, "vllm.entrypoints.openai.api_server"},
		{[]string{"python3.11", "-u", "-m", "sglang.launch_server", "--model-path", "M"}, "sglang.launch_server"},
		{[]string{"python3", "-msglang.launch_server"}, "sglang.launch_server"},
		{[]string{"/opt/llama.cpp/bin/llama-server", "-m", "x.gguf"}, "llama-server"},
		{[]string{"/Users/me/.venv/bin/python3", "/Users/me/.venv/bin/mlx_lm.server", "--model", "M"}, "mlx_lm.server"},
		{[]string{"python3", "-X", "dev", "serve.py"}, "serve.py"},
		{[]string{"python3", "-c", "print(1)"}, "-c"},
		{[]string{"nginx: worker process"}, "nginx: worker process"},
		{nil, ""},
	} {
		if got := Program(tt.argv); got != tt.want {
			t.Errorf("Program(%q) = %q, want %q", tt.argv, got, tt.want)
		}
	}
}
