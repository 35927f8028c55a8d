package grammar

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// Hostile is the corpus every gateway-bound check is tried with: strings
// that broke out of a gateway configuration, a comment or a YAML value, or
// pointed a gateway at a socket or an address the agent did not own.
var hostile = []string{
	"", " ", "a b", "a\nb", "a\rb", "a\tb", "k\n    server 10.0.0.1:80;", "k;", "k{", "k}", "k#", `k"`, "k'", "k\\",
	"k$x", "k`", "k\x00", "k\x7f", "ké", "-k", "k\n  general_settings:\n    master_key: x", "k %s", "k,",
	strings.Repeat("a", 300),
}

func TestCapacityKey(t *testing.T) {
	for _, ok := range []string{"3f9c2a1b0d4e5f67", "k", "gpu-a/e0", "gpu-a:sglang:Qwen/Qwen3-8B:3f9c", "node/vllm/fake", "cli:",
		"a_b.c+d=e@f", "gpu-a|vllm|Qwen/Qwen3-8B|port=8000", strings.Repeat("k", MaxKeyBytes)} {
		if err := CapacityKey(ok); err != nil {
			t.Errorf("CapacityKey(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range append(hostile, strings.Repeat("k", MaxKeyBytes+1)) {
		err := CapacityKey(bad)
		if err == nil {
			t.Errorf("CapacityKey(%q) = nil, want a refusal", bad)
		} else if !errors.Is(err, ErrGrammar) {
			t.Errorf("CapacityKey(%q) = %v, does not wrap ErrGrammar", bad, err)
		}
	}
}

// Node names as hosts, Kubernetes pods and heft's own tools and tests
// name them pass; what could not be one path segment, or reads as an
// option, does not.
func TestNodeName(t *testing.T) {
	for _, ok := range []string{"gpu-a", "n", "GPU-A", "node-0042", "ghost-00001", "vllm-0", "vllm-7d9f8c6b5-x2x4q",
		"ip-10-0-1-5.ec2.internal", "Johns-MacBook-Pro.local", "gpu_a", "_gpu", "0gpu", strings.Repeat("n", MaxHostBytes)} {
		if err := NodeName(ok); err != nil {
			t.Errorf("NodeName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range append(hostile, strings.Repeat("n", MaxHostBytes+1), ".", "..", ".gpu", "-gpu", "gpu/a", "gpu:a",
		"gpu%2fa", "gpu a", "gpu@a", "gpu+a", "gpu\u202egnp.exe") {
		err := NodeName(bad)
		if err == nil {
			t.Errorf("NodeName(%q) = nil, want a refusal", bad)
		} else if !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "node name") || !strings.Contains(err.Error(), NodeRule) {
			t.Errorf("NodeName(%q) = %v, want an ErrGrammar that says the node name rule", bad, err)
		}
	}
}

func TestModel(t *testing.T) {
	for _, ok := range []string{"Qwen/Qwen3-8B", "qwen3:8b", "mlx-community/Qwen3-8B-4bit", "qwen2.5-7b-instruct-q4_k_m",
		"/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", "m", strings.Repeat("m", MaxModelBytes)} {
		if err := Model(ok); err != nil {
			t.Errorf("Model(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range append(hostile, strings.Repeat("m", MaxModelBytes+1), "My Model.gguf") {
		if err := Model(bad); err == nil {
			t.Errorf("Model(%q) = nil, want a refusal", bad)
		}
	}
}

func TestAddress(t *testing.T) {
	for _, ok := range []string{"10.0.0.1:8000", "gpu-a:8000", "gpu-a.example.com:443", "gpu-a.example.com.:443", "[::1]:8000",
		"[2001:db8::1]:80", "127.0.0.1:1", "localhost:65535", "x_y.internal:80", "a1:80"} {
		if err := Address(ok); err != nil {
			t.Errorf("Address(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "gpu-a", "gpu-a:", ":80", "gpu-a:0", "gpu-a:65536", "gpu-a:+80", "gpu-a:080", "gpu-a:http",
		"unix:80", "UNIX:80", "unix:/run/x.sock", "::1:80", "[fe80::1%eth0]:80", "[10.0.0.1]:80", "1.2.3:80", "0x7f000001:80",
		"017:80", "10.0.0.256:80", "-gpu:80", "gpu-:80", "a..b:80", ".a:80", "gpu a:80", "gpu;a:80", "gpu{:80", "gpu#:80",
		`gpu":80`, "gpu\n:80", "gpu-a:80;", "gpu-a:80 backup", "gpu-a:80\n    server evil:80", "héllo:80",
		strings.Repeat("a", 64) + ":80", strings.Repeat("a.", 127) + "a:80"} {
		if err := Address(bad); err == nil {
			t.Errorf("Address(%q) = nil, want a refusal", bad)
		}
	}
}

func TestURL(t *testing.T) {
	for raw, want := range map[string]string{
		"http://10.0.0.1:8000":       "10.0.0.1:8000",
		"http://gpu-a:8000/":         "gpu-a:8000",
		"https://gpu-a.example.com":  "gpu-a.example.com:443",
		"http://gpu-a":               "gpu-a:80",
		"http://[::1]:8000/v1":       "[::1]:8000",
		"http://127.0.0.1:8000/base": "127.0.0.1:8000",
	} {
		got, err := URL(raw)
		if err != nil || got != want {
			t.Errorf("URL(%q) = %q, %v, want %q", raw, got, err, want)
		}
	}
	for _, bad := range []string{"", "gpu-a:8000", "unix:80", "http://unix:80", "http://unix", "ftp://gpu-a", "http://u:p@gpu-a",
		"http://gpu-a/?x=1", "http://gpu-a/#f", "http://gpu-a:/", "http://gpu-a:0", "http://gpu a:80", "http://gpu-a/a b",
		"http://gpu-a/%0a", "http://gpu-a;x:80", "http://0x7f000001:80", "http://[fe80::1%25eth0]:80", "http:gpu-a",
		"http://gpu-a/x;y", "http://gpu-a/{x}"} {
		if got, err := URL(bad); err == nil {
			t.Errorf("URL(%q) = %q, nil, want a refusal", bad, got)
		}
	}
}

// safe is the property every accepted string has: nothing that ends a
// token, a line, a quoted string or a comment in any gateway's language.
func safe(t *testing.T, what, s string) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"'`;{}#\\$,%&*!?<>()~^", c) >= 0 {
			t.Fatalf("%s accepted %q, which holds %q", what, s, c)
		}
	}
}

// FuzzGrammar: whatever a check accepts is bounded, holds no byte that
// could end a token, line, string or comment in a gateway's configuration,
// and an accepted address is its own canonical host:port.
func FuzzGrammar(f *testing.F) {
	for _, s := range append(hostile, "gpu-a:8000", "[::1]:80", "http://gpu-a:8000/v1", "Qwen/Qwen3-8B", "unix:80") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if CapacityKey(s) == nil {
			safe(t, "CapacityKey", s)
			if len(s) > MaxKeyBytes {
				t.Fatalf("CapacityKey accepted %d bytes", len(s))
			}
		}
		if Model(s) == nil {
			safe(t, "Model", s)
			if len(s) > MaxModelBytes {
				t.Fatalf("Model accepted %d bytes", len(s))
			}
		}
		if NodeName(s) == nil {
			safe(t, "NodeName", s)
			if len(s) > MaxHostBytes || strings.ContainsAny(s, "/:%") || s[0] == '.' {
				t.Fatalf("NodeName accepted %q", s)
			}
		}
		if Address(s) == nil {
			checkAddress(t, s)
		}
		if hp, err := URL(s); err == nil {
			checkAddress(t, hp)
		}
	})
}

func checkAddress(t *testing.T, s string) {
	t.Helper()
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("Address accepted %q, which does not split: %v", s, err)
	}
	if net.JoinHostPort(host, port) != s {
		t.Fatalf("Address accepted %q, which is not its canonical form %q", s, net.JoinHostPort(host, port))
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "unix") {
		t.Fatalf("Address accepted %q", s)
	}
	safe(t, "Address", strings.NewReplacer("[", "", "]", "").Replace(s))
}
