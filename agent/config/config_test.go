package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// productTOML is the agent example from PRODUCT.md, verbatim.
const productTOML = `# heft-agent
[coordinator]
url = "ws://127.0.0.1:7070/api/v1/agent"
token = "s3cret"                 # or token_file = "/etc/heft/agent.token"
[node]
name = "gpu-a"                   # default: the host name
[[engine]]
kind = "vllm"                    # vllm | sglang | mlx | llamacpp | ollama
url = "http://127.0.0.1:8000"
log = "/var/log/vllm/server.log" # optional: the engine's start-up log
advertise_url = "http://10.0.0.5:8000" # what gateways dial (default: see the gateways issue)
`

func writeFile(t *testing.T, name, text string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadProductExample(t *testing.T) {
	path := writeFile(t, "agent.toml", productTOML, 0o600)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("product example does not validate: %v", err)
	}
	if cfg.Coordinator.URL != "ws://127.0.0.1:7070/api/v1/agent" || cfg.Coordinator.Token != "s3cret" {
		t.Errorf("coordinator = %+v", cfg.Coordinator)
	}
	if cfg.Node.Name != "gpu-a" {
		t.Errorf("node = %q", cfg.Node.Name)
	}
	want := Engine{Kind: "vllm", URL: "http://127.0.0.1:8000", Log: "/var/log/vllm/server.log", AdvertiseURL: "http://10.0.0.5:8000"}
	if len(cfg.Engines) != 1 || cfg.Engines[0] != want {
		t.Errorf("engines = %+v", cfg.Engines)
	}
	if cfg.Probe.Concurrency != 16 || cfg.Probe.Tokens != 128 || cfg.SnapshotInterval != 15*time.Second ||
		cfg.PollInterval != time.Second || cfg.Log.Level != "info" {
		t.Errorf("defaults not kept: %+v", cfg)
	}
	if cfg.Path != path {
		t.Errorf("path = %q", cfg.Path)
	}
	// Loopback over ws:// is fine.
	if w := cfg.PlainTextWarning(); w != "" {
		t.Errorf("warning for loopback: %q", w)
	}
}

func TestParseAllKeys(t *testing.T) {
	cfg := Default()
	err := cfg.Parse(`
snapshot_interval = "30s"
poll_interval = "250ms"
listen = "127.0.0.1:7071"
[coordinator]
url = "wss://coord.example:7070/api/v1/agent"
token_file = "/etc/heft/agent.token"
ca_file = "/etc/heft/ca.pem"
insecure_skip_verify = true
[probe]
concurrency = 8
tokens = 64
prompt = "count"
prefill = false
prefill_concurrency = 2
prefill_tokens = 4096
busy = "drain"
busy_wait = "45s"
passive_window = "5s"
pace_window = "4s"
[log]
level = "debug"
json = true
[[engine]]
kind = "sglang"
url = "http://127.0.0.1:30000"
model = "qwen"
[[engine]]
kind = "ollama"
url = "http://127.0.0.1:11434"
`)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SnapshotInterval != 30*time.Second || cfg.PollInterval != 250*time.Millisecond || cfg.Listen != "127.0.0.1:7071" {
		t.Errorf("intervals = %s %s, listen %q", cfg.SnapshotInterval, cfg.PollInterval, cfg.Listen)
	}
	c := cfg.Coordinator
	if c.TokenFile != "/etc/heft/agent.token" || c.CAFile != "/etc/heft/ca.pem" || !c.InsecureSkipVerify {
		t.Errorf("coordinator = %+v", c)
	}
	if cfg.Probe != (Probe{Concurrency: 8, Tokens: 64, Prompt: "count", PrefillConcurrency: 2, PrefillTokens: 4096, Busy: "drain", BusyWait: 45 * time.Second, PassiveWindow: 5 * time.Second, PaceWindow: 4 * time.Second}) ||
		cfg.Log != (Log{Level: "debug", JSON: true}) {
		t.Errorf("probe %+v log %+v", cfg.Probe, cfg.Log)
	}
	if len(cfg.Engines) != 2 || cfg.Engines[0].Model != "qwen" || cfg.Engines[1].Kind != "ollama" {
		t.Errorf("engines = %+v", cfg.Engines)
	}
}

func TestUnknownKeysNamed(t *testing.T) {
	cfg := Default()
	err := cfg.Parse("[coordinator]\nurl = \"ws://x\"\ntokn = \"a\"\n[[engine]]\nkind = \"vllm\"\nadress = \"x\"\n")
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	for _, k := range []string{"coordinator.tokn", "engine.adress"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %s", err, k)
		}
	}
}

func TestBadTOML(t *testing.T) {
	path := writeFile(t, "bad.toml", "[coordinator\nurl=", 0o600)
	_, err := Load(path, nil, nil)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want one naming the file", err)
	}
	for _, tc := range []struct{ text, want string }{
		{`snapshot_interval = "soon"`, "soon"},
		{`poll_interval = 15`, `write poll_interval = "15s"`},
		{"[probe]\nconcurrency = \"lots\"\n", "line 2"},
		{"[engine]\nkind = \"vllm\"\n", "[[engine]]"},
		{"[coordinator]\nurl = 5\n", "coordinator.url"},
	} {
		cfg := Default()
		if err := cfg.Parse(tc.text); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one mentioning %q", tc.text, err, tc.want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml"), nil, nil); err == nil {
		t.Error("missing file accepted")
	}
}

func TestNodeDefaultsToHostname(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no host name here:", err)
	}
	cfg, err := Read("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Node.Name != host {
		t.Errorf("node = %q, want host name %q", cfg.Node.Name, host)
	}
}

func TestLayering(t *testing.T) {
	path := writeFile(t, "agent.toml", productTOML, 0o600)
	tokFile := writeFile(t, "tok", "from-file\n", 0o600)

	t.Run("env over file", func(t *testing.T) {
		cfg, err := Load(path, nil, envOf(map[string]string{
			"HEFT_COORDINATOR_URL":   "wss://c.example/api/v1/agent",
			"HEFT_TOKEN_FILE":        tokFile,
			"HEFT_NODE":              "gpu-env",
			"HEFT_ENGINES":           "sglang=http://127.0.0.1:30000,log=/tmp/s.log; mlx=http://127.0.0.1:8080",
			"HEFT_PROBE_CONCURRENCY": "4",
			"HEFT_LOG_JSON":          "true",
			"HEFT_POLL_INTERVAL":     "2s",
		}))
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("validate: %v", err)
		}
		if cfg.Coordinator.URL != "wss://c.example/api/v1/agent" || cfg.Node.Name != "gpu-env" {
			t.Errorf("got %+v", cfg)
		}
		// token_file from env replaces the file's token instead of clashing.
		if cfg.Coordinator.Token != "" || cfg.Coordinator.TokenFile != tokFile {
			t.Errorf("coordinator = %+v", cfg.Coordinator)
		}
		if len(cfg.Engines) != 2 || cfg.Engines[0] != (Engine{Kind: "sglang", URL: "http://127.0.0.1:30000", Log: "/tmp/s.log"}) {
			t.Errorf("engines = %+v", cfg.Engines)
		}
		if cfg.Probe.Concurrency != 4 || !cfg.Log.JSON || cfg.PollInterval != 2*time.Second {
			t.Errorf("got %+v", cfg)
		}
	})

	t.Run("flags over env", func(t *testing.T) {
		cfg, err := Load("", []string{
			"--config", path,
			"--coordinator", "ws://10.0.0.5:7070/api/v1/agent",
			"--token-file", tokFile,
			"--node", "gpu-flag",
			"--engine", "vllm=http://127.0.0.1:8001,log=/tmp/v.log,model=m,advertise=http://10.0.0.7:8001",
			"--engine", "llamacpp=http://127.0.0.1:8002",
			"--log-level", "debug",
		}, envOf(map[string]string{"HEFT_NODE": "gpu-env", "HEFT_TOKEN": "env-token", "HEFT_LOG_LEVEL": "warn"}))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Path != path || cfg.Node.Name != "gpu-flag" || cfg.Log.Level != "debug" {
			t.Errorf("got %+v", cfg)
		}
		if cfg.Coordinator.Token != "" || cfg.Coordinator.TokenFile != tokFile {
			t.Errorf("coordinator = %+v", cfg.Coordinator)
		}
		if len(cfg.Engines) != 2 || cfg.Engines[0] != (Engine{Kind: "vllm", URL: "http://127.0.0.1:8001", Log: "/tmp/v.log", Model: "m", AdvertiseURL: "http://10.0.0.7:8001"}) {
			t.Errorf("engines = %+v", cfg.Engines)
		}
		tok, err := cfg.Token()
		if err != nil || tok != "from-file" {
			t.Errorf("token = %q, %v", tok, err)
		}
	})

	t.Run("HEFT_CONFIG names the file", func(t *testing.T) {
		cfg, err := Load("", nil, envOf(map[string]string{"HEFT_CONFIG": path}))
		if err != nil || cfg.Node.Name != "gpu-a" {
			t.Fatalf("cfg %+v err %v", cfg, err)
		}
	})

	t.Run("unset flags keep lower layers", func(t *testing.T) {
		cfg, err := Load(path, []string{"--log-level", "warn"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Probe.Concurrency != 16 || cfg.Coordinator.Token != "s3cret" || len(cfg.Engines) != 1 {
			t.Errorf("flag defaults leaked over the file: %+v", cfg)
		}
	})
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		flagErr bool
	}{
		{"unknown flag", []string{"--nope"}, nil, "nope", true},
		{"bad engine flag", []string{"--engine", "vllm"}, nil, "KIND=URL", true},
		{"bad engine option", []string{"--engine", "vllm=http://x,color=red"}, nil, "color", true},
		{"stray argument", []string{"extra"}, nil, "extra", true},
		{"bad env number", nil, map[string]string{"HEFT_PROBE_TOKENS": "many"}, "HEFT_PROBE_TOKENS", false},
		{"bad env duration", nil, map[string]string{"HEFT_SNAPSHOT_INTERVAL": "5"}, "HEFT_SNAPSHOT_INTERVAL", false},
		{"bad env bool", nil, map[string]string{"HEFT_LOG_JSON": "yes please"}, "HEFT_LOG_JSON", false},
		{"bad env engine", nil, map[string]string{"HEFT_ENGINES": "vllm"}, "HEFT_ENGINES", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", tc.args, envOf(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
			var fe *FlagError
			if errors.As(err, &fe) != tc.flagErr {
				t.Errorf("FlagError = %v, want %v", errors.As(err, &fe), tc.flagErr)
			}
		})
	}
	if _, err := Load("", []string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	openFile := writeFile(t, "tok", "x", 0o644)
	cfg := Default()
	cfg.Node.Name = ""
	cfg.Engines = []Engine{{Kind: "tgi", URL: "http://127.0.0.1:1"}, {Kind: "vllm", URL: "ftp://x"},
		{Kind: "sglang", URL: "http://127.0.0.1:30000", Log: "journal:sglang"}}
	cfg.Probe.Concurrency = 0
	cfg.Log.Level = "loud"
	cfg.PollInterval = 0
	err := cfg.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no coordinator URL", "no agent token", "no node name", `unknown kind "tgi"`,
		"engine 2", `engine 3: log: bad log source "journal:sglang": unknown kind "journal:"`, "concurrency", `log level "loud"`, "poll_interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}

	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"both token forms", func(c *Config) { c.Coordinator.TokenFile = "/x" }, "both token and token_file"},
		{"open token file", func(c *Config) { c.Coordinator.Token, c.Coordinator.TokenFile = "", openFile }, "chmod 600"},
		{"group-writable token file", func(c *Config) {
			c.Coordinator.Token, c.Coordinator.TokenFile = "", writeFile(t, "tok-gw", "x", 0o660)
		}, "mode 0660"},
		{"missing token file", func(c *Config) { c.Coordinator.Token, c.Coordinator.TokenFile = "", "/does/not/exist" }, "token file"},
		{"empty token file", func(c *Config) {
			c.Coordinator.Token, c.Coordinator.TokenFile = "", writeFile(t, "empty", " \n", 0o600)
		}, "is empty"},
		// The coordinator's rules, now the agent's too.
		{"token file with two words on a line", func(c *Config) {
			c.Coordinator.Token, c.Coordinator.TokenFile = "", writeFile(t, "two", "a b\n", 0o600)
		}, "holds a space"},
		{"huge token file", func(c *Config) {
			c.Coordinator.Token, c.Coordinator.TokenFile = "", writeFile(t, "huge", strings.Repeat("x", 5000), 0o600)
		}, "larger than"},
		{"token file is a folder", func(c *Config) { c.Coordinator.Token, c.Coordinator.TokenFile = "", t.TempDir() }, "not a regular file"},
		{"engine URL with credentials", func(c *Config) {
			c.Engines = []Engine{{Kind: "vllm", URL: "http://user:pw@127.0.0.1:8000"}}
		}, "must not carry credentials"},
		{"engine URL without a scheme", func(c *Config) { c.Engines = []Engine{{Kind: "vllm", URL: "127.0.0.1:8000"}} }, "has no scheme"},
		{"advertise URL without a scheme", func(c *Config) {
			c.Engines = []Engine{{Kind: "vllm", URL: "http://127.0.0.1:8000", AdvertiseURL: "10.0.0.5:8000"}}
		}, `advertise_url "10.0.0.5:8000" has no scheme`},
		{"advertise URL with a query", func(c *Config) {
			c.Engines = []Engine{{Kind: "vllm", URL: "http://127.0.0.1:8000", AdvertiseURL: "http://10.0.0.5:8000/?x=1"}}
		}, "advertise_url"},
		{"bad scheme", func(c *Config) { c.Coordinator.URL = "tcp://h:1" }, "scheme"},
		{"no host", func(c *Config) { c.Coordinator.URL = "ws:///api" }, "no host"},
		{"unparseable", func(c *Config) { c.Coordinator.URL = "ws://%zz" }, "coordinator URL"},
		{"too many probe tokens", func(c *Config) { c.Probe.Tokens = 1 << 20 }, "probe tokens must be 1.."},
		{"too short prefill prompts", func(c *Config) { c.Probe.PrefillTokens = 100 }, "probe prefill_tokens must be 256.."},
		{"unknown busy mode", func(c *Config) { c.Probe.Busy = "sometimes" }, "probe busy must be one of wait, drain, passive-only"},
		{"no busy wait", func(c *Config) { c.Probe.BusyWait = 0 }, "probe busy_wait must be positive"},
		{"passive window too short", func(c *Config) { c.Probe.PassiveWindow = time.Second }, "probe passive_window must be at least 2s"},
		{"pace window too short", func(c *Config) { c.Probe.PaceWindow = time.Second }, "probe pace_window must be at least 2s"},
		{"no prefill requests", func(c *Config) { c.Probe.PrefillConcurrency = 0 }, "probe prefill_concurrency must be 1.."},
		{"missing CA", func(c *Config) { c.Coordinator.CAFile = "/does/not/exist" }, "ca file"},
		{"CA not PEM", func(c *Config) { c.Coordinator.CAFile = writeFile(t, "ca", "nope", 0o644) }, "no PEM"},
		{"listen without a port", func(c *Config) { c.Listen = "127.0.0.1" }, `listen "127.0.0.1": want host:port, e.g. 127.0.0.1:7071`},
		{"listen on a bad port", func(c *Config) { c.Listen = "127.0.0.1:70710" }, `port "70710" is not 0..65535`},
		{"node name with a space", func(c *Config) { c.Node.Name = "gpu a" }, `node name "gpu a" holds " " at byte 3: a node name is 1–253 bytes of ASCII letters, digits and . _ -`},
		{"node name with a slash", func(c *Config) { c.Node.Name = "rack/gpu-a" }, "set [node] name, HEFT_NODE or --node to such a name"},
		{"node name starting with a dot", func(c *Config) { c.Node.Name = ".gpu" }, `node name ".gpu" starts with "."`},
		{"node name too long", func(c *Config) { c.Node.Name = strings.Repeat("n", 254) }, "node name is 254 bytes"},
		{"poll interval that spins", func(c *Config) { c.PollInterval = time.Nanosecond }, "poll_interval must be at least 100ms"},
		{"poll interval just below the floor", func(c *Config) { c.PollInterval = 99 * time.Millisecond }, "poll_interval must be at least 100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Coordinator.URL = "ws://127.0.0.1:7070/api/v1/agent"
			c.Coordinator.Token = "t"
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestToken(t *testing.T) {
	c := Default()
	c.Coordinator.Token = "inline"
	if tok, err := c.Token(); err != nil || tok != "inline" {
		t.Errorf("inline token = %q, %v", tok, err)
	}
	c.Coordinator.Token, c.Coordinator.TokenFile = "", writeFile(t, "tok", "  abc123 \n\n", 0o600)
	if tok, err := c.Token(); err != nil || tok != "abc123" {
		t.Errorf("file token = %q, %v", tok, err)
	}
	// root:heft 0640 is how the packages and the install script lay it out.
	c.Coordinator.TokenFile = writeFile(t, "tok-640", "abc\n", 0o640)
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "token file") {
		t.Errorf("a group-readable token file was refused: %v", err)
	}
	c.Coordinator.TokenFile = filepath.Join(t.TempDir(), "gone")
	if _, err := c.Token(); err == nil {
		t.Error("missing token file gave no error")
	}
	// Token holds the file to the same rules as Validate.
	c.Coordinator.TokenFile = writeFile(t, "tok-open", "abc\n", 0o644)
	if _, err := c.Token(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("an open token file was read: %v", err)
	}
}

func TestPlainTextWarning(t *testing.T) {
	for _, tc := range []struct {
		url  string
		warn bool
	}{
		{"ws://127.0.0.1:7070/api/v1/agent", false},
		{"ws://localhost:7070/api/v1/agent", false},
		{"ws://[::1]:7070/api/v1/agent", false},
		{"wss://coord.example/api/v1/agent", false},
		{"https://10.0.0.5/api/v1/agent", false},
		{"ws://10.0.0.5:7070/api/v1/agent", true},
		{"http://coord.example/api/v1/agent", true},
	} {
		c := Default()
		c.Coordinator.URL = tc.url
		w := c.PlainTextWarning()
		if (w != "") != tc.warn {
			t.Errorf("%s: warning %q, want warning=%v", tc.url, w, tc.warn)
		}
		if tc.warn && !strings.Contains(w, "plain text") {
			t.Errorf("%s: warning %q does not say why", tc.url, w)
		}
	}
}

func TestTLSConfig(t *testing.T) {
	c := Default()
	if tc, err := c.TLSConfig(); tc != nil || err != nil {
		t.Errorf("default TLS = %v, %v; want nil, nil", tc, err)
	}
	c.Coordinator.CAFile = writeFile(t, "ca.pem", selfSignedPEM(t), 0o644)
	tc, err := c.TLSConfig()
	if err != nil || tc == nil || tc.RootCAs == nil || tc.InsecureSkipVerify {
		t.Fatalf("TLS = %+v, %v", tc, err)
	}
}

func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "heft test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// Load validates, as the coordinator's does; Read does not.
func TestLoadValidates(t *testing.T) {
	path := writeFile(t, "agent.toml", "[node]\nname = \"gpu-a\"\n", 0o600)
	if _, err := Load(path, nil, nil); err == nil || !strings.Contains(err.Error(), "no coordinator URL") {
		t.Errorf("Load: %v", err)
	}
	if cfg, err := Read(path, nil, nil); err != nil || cfg.Node.Name != "gpu-a" {
		t.Errorf("Read: %+v, %v", cfg, err)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	c := Default()
	c.Coordinator.Token = "agent-secret-1"
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), c.String()} {
		if strings.Contains(s, "secret-") || !strings.Contains(s, "coordinator.token=[redacted]") {
			t.Errorf("%s", s)
		}
	}
}

func TestLogSettings(t *testing.T) {
	path := writeFile(t, "agent.toml", productTOML, 0o600)
	cfg, err := Load(path, []string{"--engine", "sglang=http://127.0.0.1:30000", "--log-json"},
		envOf(map[string]string{"HEFT_PROBE_TOKENS": "64"}))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cfg.LogSettings(hclog.New(&hclog.LoggerOptions{Output: &buf}))
	out := buf.String()
	for _, want := range []string{
		"file=" + path,
		`coordinator.url="ws://127.0.0.1:7070/api/v1/agent (file ` + path + `)"`,
		`coordinator.token="[redacted] (file ` + path + `)"`,
		`engine="kind=sglang,url=http://127.0.0.1:30000 (flag --engine)"`,
		`probe.tokens="64 (env HEFT_PROBE_TOKENS)"`,
		`log.json="true (flag --log-json)"`,
		`[WARN]  setting overridden: key=engine value="kind=sglang,url=http://127.0.0.1:30000" from="flag --engine" ` +
			`overrides="kind=vllm,url=http://127.0.0.1:8000,log=/var/log/vllm/server.log,advertise_url=http://10.0.0.5:8000 (file ` + path + `)"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("the token was logged:\n%s", out)
	}
}

func TestHelp(t *testing.T) {
	var buf bytes.Buffer
	Usage(&buf)
	for _, want := range []string{"usage: heft-agent run", "--coordinator URL", "HEFT_COORDINATOR_URL", "--token-file FILE",
		"--engine KIND=URL[,log=SOURCE][,model=NAME][,advertise=URL]", "HEFT_ENGINES", "--engine-logs-pods-root DIR", "default /var/log/pods", "--probe-concurrency N", "HEFT_PROBE_CONCURRENCY; default 16",
		"--probe-prefill", "--probe-prefill-tokens N", "default 8192", "--log-json ", "--snapshot-interval DURATION", "default 15s", "-h, --help"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, buf.String())
		}
	}
	if strings.Contains(buf.String(), " -coordinator") {
		t.Errorf("single-dash flag in help:\n%s", buf.String())
	}
	want := []string{"HEFT_CONFIG", "HEFT_COORDINATOR_URL", "HEFT_TOKEN", "HEFT_TOKEN_FILE", "HEFT_CA_FILE",
		"HEFT_INSECURE_SKIP_VERIFY", "HEFT_NODE", "HEFT_ENGINES", "HEFT_ENGINE_LOGS_JOURNAL_DIRECTORY", "HEFT_ENGINE_LOGS_DOCKER_SOCKET",
		"HEFT_ENGINE_LOGS_DOCKER_ROOT", "HEFT_ENGINE_LOGS_PODS_ROOT", "HEFT_PROBE_CONCURRENCY", "HEFT_PROBE_TOKENS",
		"HEFT_PROBE_PROMPT", "HEFT_PROBE_PREFILL", "HEFT_PROBE_PREFILL_CONCURRENCY", "HEFT_PROBE_PREFILL_TOKENS", "HEFT_PROBE_BUSY", "HEFT_PROBE_BUSY_WAIT", "HEFT_PROBE_PASSIVE_WINDOW", "HEFT_PROBE_PACE_WINDOW", "HEFT_LOG_LEVEL", "HEFT_LOG_JSON",
		"HEFT_STATE_DIR", "HEFT_SNAPSHOT_INTERVAL", "HEFT_POLL_INTERVAL", "HEFT_DISCOVER", "HEFT_LISTEN"}
	if got := EnvVars(); !slices.Equal(got, want) {
		t.Errorf("EnvVars = %v\nwant       %v", got, want)
	}
}

// Every log source form is accepted in [[engine]] log, the host's places
// for them are settings with a stock host's defaults, and a log that is
// no source at all is refused at load with the forms it could be.
func TestEngineLogSources(t *testing.T) {
	tok := writeFile(t, "tok", "s3cret\n", 0o600)
	base := fmt.Sprintf("[coordinator]\nurl = \"ws://127.0.0.1:7070/api/v1/agent\"\ntoken_file = %q\n[node]\nname = \"gpu-a\"\n", tok)
	for _, spec := range []string{"/var/log/vllm/server.log", "/var/log/vllm/*.log", "journald:vllm", "journald:vllm.service",
		"docker:vllm", "k8s:inference/vllm-0/vllm", "k8s:inference/vllm-*/vllm", "file:/srv/a:b.log"} {
		path := writeFile(t, "agent.toml", base+fmt.Sprintf("[[engine]]\nkind = \"vllm\"\nurl = \"http://127.0.0.1:8000\"\nlog = %q\n", spec), 0o600)
		cfg, err := Load(path, nil, func(string) string { return "" })
		if err != nil {
			t.Errorf("log %q refused: %v", spec, err)
			continue
		}
		if cfg.Engines[0].Log != spec {
			t.Errorf("log %q read as %q", spec, cfg.Engines[0].Log)
		}
	}
	for spec, says := range map[string]string{
		"journal:vllm":        `unknown kind "journal:"`,
		"k8s:inference/vllm":  "needs NAMESPACE/POD/CONTAINER",
		"docker:":             "docker: needs a container",
		"/var/*/vllm.log":     "only the file name may hold",
		"journald:vllm serve": "not a systemd unit name",
	} {
		path := writeFile(t, "agent.toml", base+fmt.Sprintf("[[engine]]\nkind = \"vllm\"\nurl = \"http://127.0.0.1:8000\"\nlog = %q\n", spec), 0o600)
		_, err := Load(path, nil, func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), "engine 1: log: bad log source") || !strings.Contains(err.Error(), says) {
			t.Errorf("log %q: err = %v, want one saying %q", spec, err, says)
		}
	}

	cfg := Default()
	want := EngineLogs{DockerSocket: "/var/run/docker.sock", DockerRoot: "/var/lib/docker", PodsRoot: "/var/log/pods"}
	if cfg.EngineLogs != want {
		t.Errorf("defaults %+v, want %+v", cfg.EngineLogs, want)
	}
	path := writeFile(t, "agent.toml", base+"[engine_logs]\njournal_directory = \"/host/journal\"\ndocker_socket = \"/run/user/1000/docker.sock\"\n"+
		"docker_root = \"/srv/docker\"\npods_root = \"/host/var/log/pods\"\n", 0o600)
	cfg, err := Load(path, []string{"--engine-logs-pods-root", "/mnt/pods"}, func(k string) string {
		if k == "HEFT_ENGINE_LOGS_DOCKER_ROOT" {
			return "/env/docker"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	want = EngineLogs{JournalDirectory: "/host/journal", DockerSocket: "/run/user/1000/docker.sock", DockerRoot: "/env/docker", PodsRoot: "/mnt/pods"}
	if cfg.EngineLogs != want {
		t.Errorf("read %+v, want %+v", cfg.EngineLogs, want)
	}
}

// The coordinator's address, as people type it, is dialled at its agent
// endpoint, and the start-up lines say so; listen is off unless set.
func TestCoordinatorAddressIsCompleted(t *testing.T) {
	cfg, err := Load("", []string{"--coordinator", "http://10.0.0.5:7070", "--token", "t", "--node", "n"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, note, err := cfg.AgentURL(); got != "ws://10.0.0.5:7070/api/v1/agent" || note == "" || err != nil {
		t.Errorf("AgentURL = %q, %q, %v", got, note, err)
	}
	var buf bytes.Buffer
	cfg.LogSettings(hclog.New(&hclog.LoggerOptions{Output: &buf}))
	want := "[INFO]  settings: coordinator URL http://10.0.0.5:7070: scheme http:// becomes ws://, path /api/v1/agent added; dialling ws://10.0.0.5:7070/api/v1/agent"
	if !strings.Contains(buf.String(), want) {
		t.Errorf("start-up lines lack %q:\n%s", want, buf.String())
	}
	if cfg.Listen != "" {
		t.Errorf("listen defaults to %q, want off", cfg.Listen)
	}
	cfg.Coordinator.URL = "ws://10.0.0.5:7070/api/v1/agent"
	buf.Reset()
	cfg.LogSettings(hclog.New(&hclog.LoggerOptions{Output: &buf}))
	if strings.Contains(buf.String(), "dialling") {
		t.Errorf("a complete URL got a note:\n%s", buf.String())
	}
}

// A host name outside the node name grammar, taken as the default node
// name, is a configuration error that says it is the host's and what to
// set; a node name set in the file then passes, as names of every shape
// hosts and pods have do.
func TestHostNameOutsideTheGrammar(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "Jane's MacBook", nil }
	base := "[coordinator]\nurl = \"ws://127.0.0.1:7070/api/v1/agent\"\ntoken = \"t\"\n"
	_, err := Load(writeFile(t, "agent.toml", base, 0o600), nil, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), `the host name "Jane's MacBook" cannot be the node name`) ||
		!strings.Contains(err.Error(), "set [node] name, HEFT_NODE or --node") {
		t.Fatalf("err = %v, want the host name refused with what to set", err)
	}
	for _, name := range []string{"janes-macbook", "gpu-a", "vllm-7d9f8c6b5-x2x4q", "ip-10-0-1-5.ec2.internal", "GPU_7"} {
		cfg, err := Load(writeFile(t, "agent.toml", base+"[node]\nname = \""+name+"\"\n", 0o600), nil, func(string) string { return "" })
		if err != nil || cfg.Node.Name != name {
			t.Errorf("node name %q: %v", name, err)
		}
	}
}
