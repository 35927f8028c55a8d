package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
)

func writeFile(t *testing.T, name, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadProductExample(t *testing.T) {
	// The coordinator TOML in PRODUCT.md, verbatim.
	path := writeFile(t, "coordinator.toml", `# heft-coordinator
listen = "127.0.0.1:7070"
state_dir = "/var/lib/heft"
agent_token = "s3cret-0123456789abcdef0123456789"           # or agent_token_file
admin_token = "adm1n-0123456789abcdef0123456789"            # or admin_token_file
`, 0o644)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.Listen != "127.0.0.1:7070" || cfg.StateDir != "/var/lib/heft" {
		t.Errorf("listen/state_dir = %q %q", cfg.Listen, cfg.StateDir)
	}
	tok, err := cfg.ReadTokens()
	if err != nil {
		t.Fatal(err)
	}
	if tok.Agent != "s3cret-0123456789abcdef0123456789" || tok.Admin != "adm1n-0123456789abcdef0123456789" || tok.Viewer != "" {
		t.Errorf("tokens = %+v", tok)
	}
	if cfg.Fleet.CacheTTL != 6*time.Hour || cfg.Fleet.WeightMin != 0.25 || cfg.Fleet.WeightMax != 8 {
		t.Errorf("defaults lost: %v", cfg)
	}
}

func TestLoadFullFileDurationsAndThresholds(t *testing.T) {
	path := writeFile(t, "c.toml", `
listen = "0.0.0.0:8443"
state_dir = "/tmp/heft"
agent_token = "a-0123456789abcdef0123456789xxxx"
log_level = "debug"
log_json = true
offline_grace = "30s"
cache_ttl = "1h30m"
remeasure_every = "2h"
weight_min = 0.5
weight_max = 4
[thresholds]
pool_hold = 0.4
pool_warn = 0.8
clock_low = 0.7
`, 0o600)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.Fleet.OfflineGrace != 30*time.Second || cfg.Fleet.CacheTTL != 90*time.Minute || cfg.Fleet.RemeasureEvery != 2*time.Hour {
		t.Errorf("durations = %s %s %s", cfg.Fleet.OfflineGrace, cfg.Fleet.CacheTTL, cfg.Fleet.RemeasureEvery)
	}
	if cfg.Fleet.Thresholds.PoolHold != 0.4 || cfg.Fleet.Thresholds.PoolWarn != 0.8 || cfg.Fleet.Thresholds.ClockLow != 0.7 {
		t.Errorf("thresholds = %+v", cfg.Fleet.Thresholds)
	}
	if cfg.Fleet.Thresholds.ForeignMinBytes != 256<<20 {
		t.Errorf("unset threshold lost its default: %d", cfg.Fleet.Thresholds.ForeignMinBytes)
	}
	if !cfg.LogJSON || cfg.LogLevel != "debug" || cfg.Fleet.WeightMin != 0.5 || cfg.Fleet.WeightMax != 4 {
		t.Errorf("cfg = %v", cfg)
	}
}

func TestLoadRejectsUnknownKeys(t *testing.T) {
	path := writeFile(t, "c.toml", `
listne = "127.0.0.1:7070"
agent_token = "a-0123456789abcdef0123456789xxxx"
[thresholds]
pool_hodl = 0.3
`, 0o600)
	_, err := Load(path, nil, nil)
	if err == nil {
		t.Fatal("want an error for unknown keys")
	}
	for _, k := range []string{"listne", "thresholds.pool_hodl"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %q", err, k)
		}
	}
}

func TestLoadParseErrorHasPosition(t *testing.T) {
	path := writeFile(t, "c.toml", "listen = \"127.0.0.1:7070\"\nagent_token = \n", 0o600)
	_, err := Load(path, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("want a parse error naming line 2, got %v", err)
	}
}

func TestLoadBadDurationInFile(t *testing.T) {
	path := writeFile(t, "c.toml", "agent_token = \"a-0123456789abcdef0123456789xxxx\"\ncache_ttl = \"soon\"\n", 0o600)
	if _, err := Load(path, nil, nil); err == nil || !strings.Contains(err.Error(), "soon") {
		t.Fatalf("want an error naming the bad duration, got %v", err)
	}
}

func TestLayering(t *testing.T) {
	path := writeFile(t, "c.toml", `
listen = "127.0.0.1:1"
state_dir = "/from/file"
agent_token = "file-token-0123456789abcdef0123456789"
cache_ttl = "1h"
`, 0o600)
	env := envMap(map[string]string{
		"HEFT_COORDINATOR_LISTEN":               "127.0.0.1:2",
		"HEFT_COORDINATOR_AGENT_TOKEN":          "env-token-0123456789abcdef0123456789",
		"HEFT_COORDINATOR_THRESHOLDS_POOL_HOLD": "0.3",
		"HEFT_COORDINATOR_CACHE_TTL":            "2h",
	})
	cfg, err := Load("", []string{"--config", path, "--listen", "127.0.0.1:3", "--cache-ttl=3h"}, env)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.Listen != "127.0.0.1:3" {
		t.Errorf("flag should beat env and file: listen = %q", cfg.Listen)
	}
	if cfg.Fleet.CacheTTL != 3*time.Hour {
		t.Errorf("flag should beat env: cache_ttl = %s", cfg.Fleet.CacheTTL)
	}
	if cfg.StateDir != "/from/file" {
		t.Errorf("file should beat defaults: state_dir = %q", cfg.StateDir)
	}
	if cfg.AgentToken != "env-token-0123456789abcdef0123456789" {
		t.Errorf("env should beat file: agent_token not from env")
	}
	if cfg.Fleet.Thresholds.PoolHold != 0.3 {
		t.Errorf("env threshold = %g", cfg.Fleet.Thresholds.PoolHold)
	}
}

func TestConfigPathFromEnv(t *testing.T) {
	path := writeFile(t, "c.toml", "agent_token = \"a-0123456789abcdef0123456789xxxx\"\nstate_dir = \"/x\"\n", 0o600)
	cfg, err := Load("", nil, envMap(map[string]string{"HEFT_COORDINATOR_CONFIG": path}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != "/x" {
		t.Errorf("state_dir = %q", cfg.StateDir)
	}
}

func TestLoadFlagErrors(t *testing.T) {
	env := envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": "a-0123456789abcdef0123456789xxxx"})
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--nope"}, "nope"},
		{"bad duration", []string{"--offline-grace", "forever"}, "--offline-grace"},
		{"bad number", []string{"--weight-max", "lots"}, "--weight-max"},
		{"stray argument", []string{"run"}, `unexpected argument "run"`},
		{"secret as flag", []string{"--agent-token", "x"}, "agent-token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", tc.args, env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
	if _, err := Load("", []string{"-h"}, env); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if _, err := Load("", []string{"--config", filepath.Join(t.TempDir(), "missing.toml")}, env); err == nil {
		t.Error("a missing config file must be an error")
	}
}

func TestVersionFlagSkipsEverything(t *testing.T) {
	cfg, err := Load("/does/not/exist.toml", []string{"--version"}, nil)
	if err != nil || !cfg.ShowVersion {
		t.Fatalf("cfg.ShowVersion=%t err=%v", cfg.ShowVersion, err)
	}
}

func TestTokenFiles(t *testing.T) {
	good := writeFile(t, "agent.token", "  tok-from-file-0123456789abcdef0123456789\n", 0o600)
	open := writeFile(t, "open.token", "tok\n", 0o644)
	groupRead := writeFile(t, "group-read.token", "tok-0123456789abcdef0123456789xx\n", 0o640)
	groupWrite := writeFile(t, "group-write.token", "tok\n", 0o660)
	empty := writeFile(t, "empty.token", "\n\n", 0o600)
	twoLines := writeFile(t, "two.token", "tok-old-0123456789abcdef0123456789\nshort\n", 0o600)
	rotating := writeFile(t, "rotating.token", "tok-old-0123456789abcdef0123456789\n\ntok-new-0123456789abcdef0123456789\n", 0o600)

	cfg := Default()
	cfg.AgentTokenFile = good
	cfg.AdminToken = "adm-0123456789abcdef0123456789xx"
	tok, err := cfg.ReadTokens()
	if err != nil || tok.Agent != "tok-from-file-0123456789abcdef0123456789" {
		t.Fatalf("tokens=%+v err=%v", tok, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	// During a rotation the file holds the old and the new token: both
	// count.
	cfg.AgentTokenFile = rotating
	if tok, err := cfg.ReadTokens(); err != nil || tok.Agent != "tok-old-0123456789abcdef0123456789\ntok-new-0123456789abcdef0123456789" {
		t.Fatalf("two tokens: %q %v", tok.Agent, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a token file of two tokens was refused: %v", err)
	}
	cfg.AdminToken = "tok-new-0123456789abcdef0123456789"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "admin_token must differ") {
		t.Fatalf("an admin token among the agent tokens: %v", err)
	}
	cfg.AdminToken = "adm-0123456789abcdef0123456789xx"
	// root:heft 0640 is how the packages lay tokens out.
	cfg.AgentTokenFile = groupRead
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a group-readable token file was refused: %v", err)
	}

	for _, tc := range []struct {
		name, path, want string
	}{
		{"world readable", open, "chmod 600"},
		{"group writable", groupWrite, "mode 0660"},
		{"empty", empty, "is empty"},
		{"a short token among two", twoLines, "a token in agent_token_file"},
		{"too short", writeFile(t, "short.token", "hunter2\n", 0o600), "at least 32"},
		{"missing", filepath.Join(t.TempDir(), "nope"), "no such file"},
		{"directory", t.TempDir(), "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.AgentTokenFile = tc.path
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "agent_token_file") {
				t.Fatalf("want error with %q naming agent_token_file, got %v", tc.want, err)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	tokFile := writeFile(t, "admin.token", "x\n", 0o600)
	cfg := Default()
	cfg.Listen = "7070"
	cfg.AdminToken = "a"
	cfg.AdminTokenFile = tokFile
	cfg.Server.TLSCertFile = "/etc/cert.pem"
	cfg.Fleet.Thresholds.PoolHold = 0.95 // above pool_warn
	cfg.Fleet.Thresholds.ClockLow = 1.5
	cfg.Fleet.WeightMin = 2
	cfg.Fleet.WeightMax = 1
	cfg.Fleet.CacheTTL = 0
	cfg.LogLevel = "loud"
	cfg.AgentCheckListen = "7071"
	err := cfg.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{
		"listen", "agent_token (or agent_token_file) is required", "admin_token and admin_token_file are both set",
		"tls_cert_file and tls_key_file must be set together", "pool_hold", "clock_low", "weight_min", "cache_ttl",
		"log_level", `agent_check_listen "7071" is not host:port`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// A token shorter than 32 bytes could be guessed; the message says how to
// make a good one.
func TestShortTokensRefused(t *testing.T) {
	for _, key := range []string{"agent_token", "admin_token", "viewer_token"} {
		cfg := Default()
		cfg.AgentToken, cfg.AdminToken = "a-0123456789abcdef0123456789xxxx", "b-0123456789abcdef0123456789xxxx"
		switch key {
		case "agent_token":
			cfg.AgentToken = "x"
		case "admin_token":
			cfg.AdminToken = "0123456789abcdef0123456789abcde" // 31 bytes
		case "viewer_token":
			cfg.ViewerToken = "viewer"
		}
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), key+" is") || !strings.Contains(err.Error(), "heft-coordinator gen-token") {
			t.Errorf("%s too short: got %v", key, err)
		}
	}
	if tok := NewToken(); len(tok) < MinTokenBytes || strings.ContainsAny(tok, "+/=\n") || tok == NewToken() {
		t.Errorf("NewToken = %q", tok)
	}
}

func TestTrustedProxies(t *testing.T) {
	cfg := Default()
	cfg.TrustedProxies = []string{"10.0.0.0/8", "192.0.2.7", "::1", "10.1.2.3/8", "proxy.example"}
	got, err := cfg.Proxies()
	if err == nil || !strings.Contains(err.Error(), `"proxy.example" is neither`) {
		t.Errorf("want an error naming the hostname, got %v", err)
	}
	var s []string
	for _, p := range got {
		s = append(s, p.String())
	}
	if strings.Join(s, " ") != "10.0.0.0/8 192.0.2.7/32 ::1/128 10.0.0.0/8" {
		t.Errorf("prefixes %v", s)
	}
}

func TestAgentCheckListenNeedsItsOwnPort(t *testing.T) {
	cfg := Default()
	cfg.AgentToken = "a-0123456789abcdef0123456789xxxx"
	cfg.AgentCheckListen = cfg.Listen
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "port of its own") {
		t.Errorf("agent_check_listen = listen: %v", err)
	}
	cfg.AgentCheckListen = "127.0.0.1:7071"
	if err := cfg.Validate(); err != nil {
		t.Errorf("agent_check_listen 127.0.0.1:7071: %v", err)
	}
}

func TestValidateSameAgentAndAdminToken(t *testing.T) {
	cfg := Default()
	cfg.AgentToken, cfg.AdminToken = "same-0123456789abcdef0123456789xxxx", "same-0123456789abcdef0123456789xxxx"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "must differ") {
		t.Fatalf("got %v", err)
	}
}

func TestSecretsNeverPrinted(t *testing.T) {
	cfg := Default()
	cfg.AgentToken, cfg.AdminToken, cfg.ViewerToken = "agent-secret-1", "admin-secret-2", "viewer-secret-3"
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), cfg.String()} {
		if strings.Contains(s, "secret-") {
			t.Errorf("a token leaked: %s", s)
		}
	}
}

func TestUsageNamesEnvAndFlags(t *testing.T) {
	u := Usage()
	for _, want := range []string{"--listen", "HEFT_COORDINATOR_LISTEN", "--state-dir", "--thresholds-pool-hold", "HEFT_COORDINATOR_AGENT_TOKEN"} {
		if !strings.Contains(u, want) {
			t.Errorf("usage lacks %q", want)
		}
	}
}

// A bare number used to load as nanoseconds: offline_grace = 30 was 30 ns,
// and passed Validate. Every duration now refuses it and says what to write.
func TestBareNumberDurationRefused(t *testing.T) {
	for _, key := range []string{"offline_grace", "agent_ping_interval", "agent_ping_timeout", "cache_ttl", "remeasure_every"} {
		t.Run(key, func(t *testing.T) {
			path := writeFile(t, "c.toml", "agent_token = \"a-0123456789abcdef0123456789xxxx\"\n"+key+" = 30\n", 0o600)
			cfg, err := Load(path, nil, nil)
			if err == nil {
				t.Fatalf("%s = 30 accepted as %v", key, cfg)
			}
			for _, want := range []string{"line 2", fmt.Sprintf(`write %s = "30s"`, key)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q: %v", want, err)
				}
			}
		})
	}
	env := envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": "a-0123456789abcdef0123456789xxxx", "HEFT_COORDINATOR_OFFLINE_GRACE": "30"})
	if _, err := Load("", nil, env); err == nil || !strings.Contains(err.Error(), "HEFT_COORDINATOR_OFFLINE_GRACE") {
		t.Errorf("env: %v", err)
	}
}

// The fleet, the node registry and the server own their defaults: the
// configuration starts from them, and each row writes into their configs.
func TestRowsBindIntoThePackagesConfigs(t *testing.T) {
	c := Default()
	if c.Fleet != fleet.DefaultConfig() || c.Nodes != nodes.DefaultConfig() {
		t.Errorf("config defaults %v differ from the fleet's %+v or the registry's %+v", c, fleet.DefaultConfig(), nodes.DefaultConfig())
	}
	path := writeFile(t, "c.toml", `agent_token = "a-0123456789abcdef0123456789abcdef"
offline_grace = "1m"
max_pending_nodes = 7
agent_ping_interval = "3s"
[plausibility]
max_node_share = 0.4
`, 0o600)
	cfg, err := Load(path, []string{"--forget-nodes-after=48h", "--max-api-requests=5"}, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Fleet.OfflineGrace != time.Minute || cfg.Fleet.MaxNodeShare != 0.4 || cfg.Nodes.MaxPending != 7 ||
		cfg.Nodes.ForgetAfter != 48*time.Hour || cfg.Server.PingInterval != 3*time.Second || cfg.Server.MaxAPIRequests != 5 {
		t.Errorf("fleet %+v\nnodes %+v\nserver %+v", cfg.Fleet, cfg.Nodes, cfg.Server)
	}
	// Each package's own validation speaks for its rows.
	cfg.Fleet.OfflineGrace, cfg.Nodes.MaxPending, cfg.Server.MaxEventStreams = 0, 0, 0
	err = cfg.Validate()
	for _, want := range []string{"offline_grace", "max_pending_nodes", "max_event_streams"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}

// A token file in a higher layer replaces a token from a lower one, as in
// the agent; both in one layer are refused.
func TestTokenAndTokenFileAcrossLayers(t *testing.T) {
	tok := writeFile(t, "agent.token", "from-file-0123456789abcdef0123456789\n", 0o600)
	path := writeFile(t, "c.toml", "agent_token = \"inline-0123456789abcdef0123456789\"\n", 0o600)
	cfg, err := Load(path, nil, envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN_FILE": tok}))
	if err != nil {
		t.Fatal(err)
	}
	if tokens, err := cfg.ReadTokens(); err != nil || tokens.Agent != "from-file-0123456789abcdef0123456789" || cfg.AgentToken != "" {
		t.Errorf("tokens = %+v, %v; cfg %v", tokens, err, cfg)
	}
	both := writeFile(t, "both.toml", "agent_token = \"inline-0123456789abcdef0123456789\"\nagent_token_file = \""+tok+"\"\n", 0o600)
	if _, err := Load(both, nil, nil); err == nil || !strings.Contains(err.Error(), "keep one") {
		t.Errorf("both in one file: %v", err)
	}
}

func TestLogJSONIsASwitch(t *testing.T) {
	cfg, err := Load("", []string{"--log-json", "--log-level", "debug"}, envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": "a-0123456789abcdef0123456789xxxx"}))
	if err != nil || !cfg.LogJSON || cfg.LogLevel != "debug" {
		t.Fatalf("cfg %v, err %v", cfg, err)
	}
}

func TestLogSettingsSaysWhereEachCameFrom(t *testing.T) {
	path := writeFile(t, "c.toml", "state_dir = \"/from/file\"\nagent_token = \"s3cret-0123456789abcdef0123456789\"\n", 0o600)
	cfg, err := Load(path, []string{"--state-dir", "/from/flag"}, envMap(map[string]string{"HEFT_COORDINATOR_CACHE_TTL": "2h"}))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cfg.LogSettings(hclog.New(&hclog.LoggerOptions{Output: &buf}))
	out := buf.String()
	for _, want := range []string{
		`state_dir="/from/flag (flag --state-dir)"`,
		`cache_ttl="2h (env HEFT_COORDINATOR_CACHE_TTL)"`,
		`agent_token="[redacted] (file ` + path + `)"`,
		`[WARN]  setting overridden: key=state_dir value=/from/flag from="flag --state-dir" overrides="/from/file (file ` + path + `)"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret-0123456789abcdef0123456789") || strings.Contains(out, "listen=") {
		t.Errorf("a secret or a default was logged:\n%s", out)
	}
}
