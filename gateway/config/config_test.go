package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const full = `
listen = "127.0.0.1:9471"
resync = "2s"
[coordinator]
url = "https://heft.example:7070"
[[haproxy]]
model = "Qwen/Qwen3-8B"
socket = "/run/haproxy/admin.sock"
backend = "qwen"
order = "weight"
[[nginx]]
model = "Qwen/Qwen3-8B"
file = "/etc/nginx/conf.d/heft-qwen.conf"
upstream = "qwen"
directives = ["least_conn", "keepalive 32"]
reload = ["nginx", "-s", "reload"]
[[envoy]]
listen = "127.0.0.1:18000"
model = "Qwen/Qwen3-8B"
state_file = "/var/lib/heft-sync/envoy-qwen.json"
[[litellm]]
model = "Qwen/Qwen3-8B"
file = "/etc/litellm/heft.yaml"
command = ["systemctl", "restart", "litellm"]
`

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "heft-sync.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) string { return "" }

func TestLoadFull(t *testing.T) {
	c, err := Load([]string{"--config", write(t, full)}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if c.Resync != 2*time.Second || len(c.HAProxy) != 1 || c.HAProxy[0].Order != "weight" || len(c.Nginx[0].Directives) != 2 ||
		c.Envoy[0].ClusterName() != "Qwen/Qwen3-8B" || c.Envoy[0].StateFile != "/var/lib/heft-sync/envoy-qwen.json" || c.LiteLLM[0].Command[0] != "systemctl" || c.Nginx[0].Check != nil {
		t.Fatalf("%+v", c)
	}
}

func TestEnvOverrides(t *testing.T) {
	env := map[string]string{"HEFT_SYNC_CONFIG": write(t, full), "HEFT_SYNC_COORDINATOR_URL": "http://10.0.0.1:7070", "HEFT_SYNC_RESYNC": "750ms"}
	c, err := Load(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Coordinator.URL != "http://10.0.0.1:7070" || c.Resync != 750*time.Millisecond {
		t.Fatalf("%+v", c)
	}
	env["HEFT_SYNC_RESYNC"] = "soon"
	if _, err := Load(nil, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "HEFT_SYNC_RESYNC") {
		t.Fatalf("a bad duration: %v", err)
	}
}

// Every problem is reported at once, before anything runs.
func TestValidate(t *testing.T) {
	bad := `
listen = "nope"
log_level = "loud"
[coordinator]
url = "ws://x"
[[haproxy]]
model = "m"
backend = "qwen"
order = "random"
state_file = "/var/lib/heft-sync/n.json.names"
[[nginx]]
model = "m"
file = "relative.conf"
upstream = "qwen"
check = []
[[nginx]]
model = "m"
file = "relative.conf"
upstream = "qwen2"
[[envoy]]
model = "m"
listen = "18000"
state_file = "/var/lib/heft-sync/m.json"
[[envoy]]
model = "n"
listen = "127.0.0.1:18000"
state_file = "/var/lib/heft-sync/./m.json"
[[envoy]]
model = "n"
listen = "127.0.0.1:18000"
cluster = "n"
state_file = "/var/lib/heft-sync/n.json"
[[litellm]]
model = "m"
file = "/tmp/x.yaml"
command = ["a"]
[[litellm]]
model = "n"
file = "/tmp/x.yaml"
command = ["b"]
`
	_, err := Load([]string{"--config", write(t, bad)}, noEnv)
	if err == nil {
		t.Fatal("took a bad config")
	}
	for _, want := range []string{"listen \"nope\"", "log_level", "url \"ws://x\"", "[[haproxy]] #1: socket is empty", "[[haproxy]] #1: order \"random\"",
		"[[nginx]] #1: file \"relative.conf\" is not an absolute path", "[[nginx]] #1: check and reload must name a command", "two [[nginx]] tables", "listen \"18000\"", "different commands", "[[envoy]] #2: state file /var/lib/heft-sync/m.json is also [[envoy]] #1's",
		"[[envoy]] #3: state file /var/lib/heft-sync/n.json.names is also [[haproxy]] #1's"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	if _, err := Parse("[coordinator]\nurl = \"http://x:1\"\nsurprise = 1\n"); err == nil || !strings.Contains(err.Error(), "surprise") {
		t.Fatalf("an unknown key: %v", err)
	}
	if _, err := Load([]string{"--config", write(t, "[coordinator]\nurl = \"http://x:1\"\n")}, noEnv); err == nil || !strings.Contains(err.Error(), "no gateway") {
		t.Fatalf("no target: %v", err)
	}
}

func TestTokenFileAndCA(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "viewer.token")
	os.WriteFile(tok, []byte("s3cret\n"), 0o600)
	c := Config{Coordinator: Coordinator{TokenFile: tok}}
	if got, err := c.Token(); err != nil || got != "s3cret" {
		t.Fatalf("Token = %q %v", got, err)
	}
	os.Chmod(tok, 0o644)
	if _, err := c.Token(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable token file: %v", err)
	}
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, []byte("not a certificate"), 0o644)
	c = Config{Coordinator: Coordinator{CAFile: ca}}
	if _, err := c.TLS(); err == nil {
		t.Fatal("took a CA file without a certificate")
	}
}

// A bare number for a duration used to load as nanoseconds (timeout = 5
// was 5 ns); it is refused with what to write, as in every heft binary.
func TestBareNumberDurationRefused(t *testing.T) {
	for _, text := range []string{
		"resync = 2\n[coordinator]\nurl = \"http://x:1\"\n",
		"[coordinator]\nurl = \"http://x:1\"\n[[haproxy]]\nmodel = \"m\"\nsocket = \"/s\"\nbackend = \"b\"\ntimeout = 5\n",
		"[coordinator]\nurl = \"http://x:1\"\n[[nginx]]\nmodel = \"m\"\nfile = \"/f\"\nupstream = \"u\"\ntimeout = 5\n",
	} {
		_, err := Load([]string{"--config", write(t, text)}, noEnv)
		if err == nil || !strings.Contains(err.Error(), "is a bare number") || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: %v", text, err)
		}
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	c, err := Parse(full + "api_key = \"sk-secret-1\"\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%#v", c)} {
		if strings.Contains(s, "sk-secret") || !strings.Contains(s, "api_key=[redacted]") {
			t.Errorf("%s", s)
		}
	}
}

func TestWeightKind(t *testing.T) {
	c, err := Parse(`
[coordinator]
url = "http://x:1"
[[haproxy]]
model = "m"
socket = "/run/haproxy.sock"
backend = "m-long"
kind = "prefill"
[[nginx]]
model = "m"
file = "/etc/nginx/conf.d/m.conf"
upstream = "m"
kind = "decode"
[[envoy]]
model = "m"
listen = "127.0.0.1:18000"
cluster = "m-long"
kind = "prefill"
[[litellm]]
model = "m"
file = "/etc/litellm/heft.yaml"
model_name = "m-long"
kind = "prefill"
min_context_tokens = 65536
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.HAProxy[0].Kind != "prefill" || c.Nginx[0].Kind != "decode" || c.Envoy[0].Kind != "prefill" || c.LiteLLM[0].Kind != "prefill" ||
		c.LiteLLM[0].MinContextTokens != 65536 {
		t.Errorf("kinds: %+v", c)
	}
	c.Nginx[0].Kind, c.HAProxy[0].MinContextTokens = "speed", -1
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), `[[nginx]] #1: kind "speed": want "decode" (the default) or "prefill"`) ||
		!strings.Contains(err.Error(), "[[haproxy]] #1: min_context_tokens -1 is negative") {
		t.Errorf("a bad kind: %v", err)
	}
}
