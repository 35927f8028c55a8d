// Package config loads heft-agent's configuration: defaults, then a TOML
// file, then HEFT_* environment variables, then command-line flags, each
// layer overriding the one before. Validate reports every problem at once.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/go-hclog"

	"heft/agent/probe"
	"heft/shared/wire"
)

// Defaults.
const (
	DefaultProbeConcurrency = 16
	DefaultProbeTokens      = 128
	DefaultSnapshotInterval = 15 * time.Second
	DefaultPollInterval     = time.Second
	DefaultLogLevel         = "info"
)

// Coordinator says where the agent reports and how it proves who it is.
type Coordinator struct {
	URL       string `toml:"url"`
	Token     string `toml:"token"`
	TokenFile string `toml:"token_file"`
	// CAFile is a PEM bundle trusted for a wss:// coordinator, in addition
	// to nothing else: when set, the system roots are not used.
	CAFile             string `toml:"ca_file"`
	InsecureSkipVerify bool   `toml:"insecure_skip_verify"`
}

// Node names this host to the coordinator.
type Node struct {
	Name string `toml:"name"`
}

// Engine is one inference engine endpoint beside the agent.
type Engine struct {
	Kind string `toml:"kind"`
	URL  string `toml:"url"`
	// Log is the engine's start-up log, optional.
	Log string `toml:"log"`
	// Model overrides the served model name, optional.
	Model string `toml:"model"`
}

// Probe shapes the measurement burst.
type Probe struct {
	Concurrency int    `toml:"concurrency"`
	Tokens      int    `toml:"tokens"`
	Prompt      string `toml:"prompt"`
}

// Log configures the agent's own logging.
type Log struct {
	Level string `toml:"level"`
	JSON  bool   `toml:"json"`
}

// Config is the whole agent configuration.
type Config struct {
	Coordinator Coordinator `toml:"coordinator"`
	Node        Node        `toml:"node"`
	Engines     []Engine    `toml:"engine"`
	Probe       Probe       `toml:"probe"`
	Log         Log         `toml:"log"`
	// SnapshotInterval is the heartbeat: a snapshot is sent at least this often.
	SnapshotInterval time.Duration `toml:"snapshot_interval"`
	// PollInterval is how often facts are compared to spot a change.
	PollInterval time.Duration `toml:"poll_interval"`

	// Path is the file the config was read from, "" when none.
	Path string `toml:"-"`
}

// Default returns the configuration before any file, env or flag.
func Default() Config {
	host, _ := os.Hostname()
	return Config{
		Node:             Node{Name: host},
		Probe:            Probe{Concurrency: DefaultProbeConcurrency, Tokens: DefaultProbeTokens},
		Log:              Log{Level: DefaultLogLevel},
		SnapshotInterval: DefaultSnapshotInterval,
		PollInterval:     DefaultPollInterval,
	}
}

// Load builds a Config from defaults, the TOML file at path ("" for none),
// the environment (env is os.Getenv in production) and the flags in args.
// A --config flag in args, or HEFT_CONFIG, names the file when path is "".
// It does not validate; call Validate. flag.ErrHelp is returned for -h.
func Load(path string, args []string, env func(string) string) (Config, error) {
	if env == nil {
		env = func(string) string { return "" }
	}
	fl, err := parseFlags(args)
	if err != nil {
		return Config{}, err
	}
	switch {
	case fl.config != nil:
		path = *fl.config
	case path == "":
		path = env("HEFT_CONFIG")
	}
	cfg := Default()
	if path != "" {
		if err := cfg.decodeFile(path); err != nil {
			return Config{}, err
		}
		cfg.Path = path
	}
	if err := cfg.applyEnv(env); err != nil {
		return Config{}, err
	}
	fl.apply(&cfg)
	return cfg, nil
}

// Parse reads TOML text into cfg on top of its current values, rejecting
// keys that match no setting.
func (c *Config) Parse(text string) error {
	md, err := toml.Decode(text, c)
	if err != nil {
		if strings.Contains(err.Error(), `last key "engine"`) {
			return fmt.Errorf("%w (write each engine as an [[engine]] table, with double brackets)", err)
		}
		return err
	}
	if err := unknownKeys(md); err != nil {
		return err
	}
	// The decoder reads a bare number as nanoseconds: "15" would mean 15ns.
	for _, key := range []string{"snapshot_interval", "poll_interval"} {
		if md.IsDefined(key) && md.Type(key) != "String" {
			return fmt.Errorf("%s must be a duration with a unit, like \"15s\"", key)
		}
	}
	return nil
}

func (c *Config) decodeFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if err := c.Parse(string(data)); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

func unknownKeys(md toml.MetaData) error {
	und := md.Undecoded()
	if len(und) == 0 {
		return nil
	}
	names := make([]string, len(und))
	for i, k := range und {
		names[i] = k.String()
	}
	return fmt.Errorf("unknown keys: %s", strings.Join(names, ", "))
}

// Validate reports every problem in the configuration, joined.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Coordinator.URL == "" {
		add("no coordinator URL: set [coordinator] url, HEFT_COORDINATOR_URL or --coordinator")
	} else if err := checkCoordinatorURL(c.Coordinator.URL); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.Coordinator.Token != "" && c.Coordinator.TokenFile != "":
		add("both token and token_file are set: keep one")
	case c.Coordinator.Token == "" && c.Coordinator.TokenFile == "":
		add("no agent token: set [coordinator] token or token_file, HEFT_TOKEN, HEFT_TOKEN_FILE or --token-file")
	case c.Coordinator.TokenFile != "":
		if err := checkTokenFile(c.Coordinator.TokenFile); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Coordinator.CAFile != "" {
		if _, err := c.TLSConfig(); err != nil {
			errs = append(errs, err)
		}
	}
	if strings.TrimSpace(c.Node.Name) == "" {
		add("no node name: set [node] name, HEFT_NODE or --node")
	} else if len(c.Node.Name) > 253 {
		add("node name is longer than 253 bytes")
	}
	if len(c.Engines) > wire.MaxEngines {
		add("%d engines configured, at most %d", len(c.Engines), wire.MaxEngines)
	}
	for i, e := range c.Engines {
		if !slices.Contains(wire.EngineKinds, e.Kind) {
			add("engine %d: unknown kind %q (want one of %s)", i+1, e.Kind, strings.Join(wire.EngineKinds, ", "))
		}
		if err := checkEngineURL(e.URL); err != nil {
			add("engine %d: %w", i+1, err)
		}
	}
	if c.Probe.Concurrency < 1 || c.Probe.Concurrency > probe.MaxConcurrency {
		add("probe concurrency must be 1..%d, got %d", probe.MaxConcurrency, c.Probe.Concurrency)
	}
	if c.Probe.Tokens < 1 || c.Probe.Tokens > probe.MaxTokens {
		add("probe tokens must be 1..%d, got %d", probe.MaxTokens, c.Probe.Tokens)
	}
	if len(c.Probe.Prompt) > wire.MaxStringBytes {
		add("probe prompt is %d bytes, at most %d", len(c.Probe.Prompt), wire.MaxStringBytes)
	}
	if hclog.LevelFromString(c.Log.Level) == hclog.NoLevel {
		add("unknown log level %q (want trace, debug, info, warn or error)", c.Log.Level)
	}
	if c.SnapshotInterval <= 0 {
		add("snapshot_interval must be positive, got %s", c.SnapshotInterval)
	}
	if c.PollInterval <= 0 {
		add("poll_interval must be positive, got %s", c.PollInterval)
	}
	return errors.Join(errs...)
}

func checkCoordinatorURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("coordinator URL %q: %w", raw, err)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return fmt.Errorf("coordinator URL %q: scheme must be ws:// or wss://", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("coordinator URL %q has no host", raw)
	}
	return nil
}

func checkEngineURL(raw string) error {
	if raw == "" {
		return errors.New("no url")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("url %q: scheme must be http:// or https://", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("url %q has no host", raw)
	}
	return nil
}

// checkTokenFile refuses a token file others can read: the token lets
// anyone impersonate this node to the coordinator.
func checkTokenFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if fi.IsDir() {
		return fmt.Errorf("token file %s is a directory", path)
	}
	// Group read is allowed (root:heft 0640, as the packages and the install
	// script lay it out); group write and any access by others are not.
	if perm := fi.Mode().Perm(); perm&0o027 != 0 {
		return fmt.Errorf("token file %s has mode %04o, so others can read it or its group can change it: run chmod 600 %s (or 640 with a dedicated group)", path, perm, path)
	}
	tok, err := readToken(path)
	if err != nil {
		return err
	}
	if tok == "" {
		return fmt.Errorf("token file %s is empty", path)
	}
	return nil
}

func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// Token returns the agent token, reading token_file when it is set.
func (c Config) Token() (string, error) {
	if c.Coordinator.TokenFile == "" {
		return c.Coordinator.Token, nil
	}
	tok, err := readToken(c.Coordinator.TokenFile)
	if err != nil {
		return "", err
	}
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", c.Coordinator.TokenFile)
	}
	return tok, nil
}

// TLSConfig returns the TLS settings for a wss:// coordinator, nil when the
// defaults (system roots, verification on) apply.
func (c Config) TLSConfig() (*tls.Config, error) {
	if c.Coordinator.CAFile == "" && !c.Coordinator.InsecureSkipVerify {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.Coordinator.InsecureSkipVerify}
	if c.Coordinator.CAFile != "" {
		pem, err := os.ReadFile(c.Coordinator.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca file %s holds no PEM certificate", c.Coordinator.CAFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// PlainTextWarning returns a loud warning when the agent token would travel
// unencrypted (ws:// or http://) to a host other than this one, and "" when
// it would not.
func (c Config) PlainTextWarning() string {
	u, err := url.Parse(c.Coordinator.URL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "http") || isLoopback(u.Hostname()) {
		return ""
	}
	return fmt.Sprintf("WARNING: the agent token is sent in plain text to %s over %s://; "+
		"anyone on the path can read it and impersonate this node. Use wss:// (TLS) for a coordinator on another host.",
		u.Host, u.Scheme)
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
