// Package config reads heft-sync's configuration: a TOML file, then
// HEFT_SYNC_* environment variables for the scalar settings, then
// validates all of it before anything runs. It is one file on purpose, so
// it can move onto a shared settings mechanism in one step.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/go-hclog"
)

// Config is the whole of heft-sync's configuration.
type Config struct {
	Listen      string        `toml:"listen"` // heft-sync's /metrics and /healthz
	LogLevel    string        `toml:"log_level"`
	LogJSON     bool          `toml:"log_json"`
	Resync      time.Duration `toml:"resync"` // how often every target is applied again
	Coordinator Coordinator   `toml:"coordinator"`
	HAProxy     []HAProxy     `toml:"haproxy"`
	Nginx       []Nginx       `toml:"nginx"`
	Envoy       []Envoy       `toml:"envoy"`
	LiteLLM     []LiteLLM     `toml:"litellm"`

	Path        string `toml:"-"` // the file read
	CheckOnly   bool   `toml:"-"` // --check: validate, check each gateway once, exit
	ShowVersion bool   `toml:"-"`
}

// Coordinator is [coordinator].
type Coordinator struct {
	URL       string `toml:"url"`
	TokenFile string `toml:"token_file"` // optional viewer (or admin) token
	CAFile    string `toml:"ca_file"`    // optional CA for an https:// coordinator
}

// HAProxy is one [[haproxy]] table.
type HAProxy struct {
	Model      string        `toml:"model"`
	Socket     string        `toml:"socket"`
	Backend    string        `toml:"backend"`
	Slots      string        `toml:"slots"`
	Order      string        `toml:"order"`
	AddServers bool          `toml:"add_servers"`
	MaxConn    bool          `toml:"maxconn"`
	Timeout    time.Duration `toml:"timeout"`
}

// Nginx is one [[nginx]] table.
type Nginx struct {
	Model      string        `toml:"model"`
	File       string        `toml:"file"`
	Upstream   string        `toml:"upstream"`
	Directives []string      `toml:"directives"`
	Check      []string      `toml:"check"`
	Reload     []string      `toml:"reload"`
	MaxConns   bool          `toml:"max_conns"`
	Timeout    time.Duration `toml:"timeout"`
}

// Envoy is one [[envoy]] table: one model served as one cluster.
type Envoy struct {
	Listen  string `toml:"listen"`
	Model   string `toml:"model"`
	Cluster string `toml:"cluster"` // default: the model name
}

// LiteLLM is one [[litellm]] table.
type LiteLLM struct {
	Model     string        `toml:"model"`
	File      string        `toml:"file"`
	Command   []string      `toml:"command"`
	ModelName string        `toml:"model_name"`
	Provider  string        `toml:"provider"`
	APIKey    string        `toml:"api_key"`
	Timeout   time.Duration `toml:"timeout"`
}

// Defaults.
const (
	DefaultListen = "127.0.0.1:9471"
	DefaultResync = 5 * time.Second
	EnvPrefix     = "HEFT_SYNC_"
)

// envKeys are the settings the environment may set, by variable.
var envKeys = []struct {
	name string
	set  func(*Config, string) error
}{
	{"LISTEN", func(c *Config, v string) error { c.Listen = v; return nil }},
	{"LOG_LEVEL", func(c *Config, v string) error { c.LogLevel = v; return nil }},
	{"LOG_JSON", func(c *Config, v string) error { c.LogJSON = v == "1" || strings.EqualFold(v, "true"); return nil }},
	{"RESYNC", func(c *Config, v string) (err error) { c.Resync, err = time.ParseDuration(v); return err }},
	{"COORDINATOR_URL", func(c *Config, v string) error { c.Coordinator.URL = v; return nil }},
	{"COORDINATOR_TOKEN_FILE", func(c *Config, v string) error { c.Coordinator.TokenFile = v; return nil }},
	{"COORDINATOR_CA_FILE", func(c *Config, v string) error { c.Coordinator.CAFile = v; return nil }},
}

// Usage is the --help text.
func Usage() string {
	var b strings.Builder
	b.WriteString(`heft-sync keeps gateways (HAProxy, nginx, Envoy, LiteLLM) in step with heft's weights.

usage: heft-sync --config FILE [--check] [--version]

  --config FILE   the TOML configuration (or ` + EnvPrefix + `CONFIG)
  --check         validate the configuration, check each gateway once, and exit
  --version       print the version

Environment (overrides the file): `)
	for i, k := range envKeys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(EnvPrefix + k.name)
	}
	b.WriteString(".\n")
	return b.String()
}

// Load reads the file named by --config (or HEFT_SYNC_CONFIG), applies the
// environment, and validates. flag.ErrHelp is returned for -h.
func Load(args []string, env func(string) string) (Config, error) {
	fs := flag.NewFlagSet("heft-sync", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", env(EnvPrefix+"CONFIG"), "")
	check := fs.Bool("check", false, "")
	ver := fs.Bool("version", false, "")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *ver {
		return Config{ShowVersion: true}, nil
	}
	if *path == "" {
		return Config{}, errors.New("no configuration: pass --config FILE (or set " + EnvPrefix + "CONFIG)")
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(string(data))
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", *path, err)
	}
	c.Path, c.CheckOnly = *path, *check
	for _, k := range envKeys {
		if v := env(EnvPrefix + k.name); v != "" {
			if err := k.set(&c, v); err != nil {
				return Config{}, fmt.Errorf("%s%s=%q: %w", EnvPrefix, k.name, v, err)
			}
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", *path, err)
	}
	return c, nil
}

// Parse decodes TOML text over the defaults; unknown keys are errors.
func Parse(text string) (Config, error) {
	c := Config{Listen: DefaultListen, LogLevel: "info", Resync: DefaultResync}
	md, err := toml.Decode(text, &c)
	if err != nil {
		return Config{}, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return Config{}, fmt.Errorf("unknown keys: %s", strings.Join(keys, ", "))
	}
	return c, nil
}

// Validate returns every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen %q is not host:port: %v", c.Listen, err)
	}
	if hclog.LevelFromString(c.LogLevel) == hclog.NoLevel {
		bad("log_level %q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	if c.Resync < 100*time.Millisecond {
		bad("resync %s is too short (at least 100ms)", c.Resync)
	}
	if u, err := url.Parse(c.Coordinator.URL); c.Coordinator.URL == "" {
		bad("[coordinator] url is required, e.g. http://127.0.0.1:7070")
	} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("[coordinator] url %q: want http://host:port or https://host:port", c.Coordinator.URL)
	}
	if c.Coordinator.TokenFile != "" {
		if _, err := c.Token(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Coordinator.CAFile != "" {
		if _, err := c.TLS(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.HAProxy)+len(c.Nginx)+len(c.Envoy)+len(c.LiteLLM) == 0 {
		bad("no gateway: add a [[haproxy]], [[nginx]], [[envoy]] or [[litellm]] table")
	}
	seen := map[string]bool{}
	dup := func(kind, key string) {
		if seen[kind+"\x00"+key] {
			bad("two [[%s]] tables name %s", kind, key)
		}
		seen[kind+"\x00"+key] = true
	}
	for i, h := range c.HAProxy {
		at := fmt.Sprintf("[[haproxy]] #%d", i+1)
		if h.Model == "" || h.Socket == "" || h.Backend == "" {
			bad("%s: model, socket and backend are required", at)
		}
		if h.Order != "" && h.Order != "address" && h.Order != "weight" {
			bad("%s: order %q: want \"address\" or \"weight\"", at, h.Order)
		}
		dup("haproxy", "socket "+h.Socket+" backend "+h.Backend)
	}
	for i, n := range c.Nginx {
		at := fmt.Sprintf("[[nginx]] #%d", i+1)
		if n.Model == "" || n.File == "" || n.Upstream == "" {
			bad("%s: model, file and upstream are required", at)
		}
		if n.File != "" && !filepath.IsAbs(n.File) {
			bad("%s: file %q must be an absolute path", at, n.File)
		}
		if len(n.Check) == 0 && n.Check != nil || len(n.Reload) == 0 && n.Reload != nil {
			bad("%s: check and reload must name a command (leave them out for nginx -t and nginx -s reload)", at)
		}
		dup("nginx", "file "+n.File)
	}
	for i, e := range c.Envoy {
		at := fmt.Sprintf("[[envoy]] #%d", i+1)
		if e.Model == "" || e.Listen == "" {
			bad("%s: model and listen are required", at)
		}
		if _, _, err := net.SplitHostPort(e.Listen); e.Listen != "" && err != nil {
			bad("%s: listen %q is not host:port", at, e.Listen)
		}
		dup("envoy", "listen "+e.Listen+" cluster "+e.ClusterName())
	}
	commands := map[string]string{}
	for i, l := range c.LiteLLM {
		at := fmt.Sprintf("[[litellm]] #%d", i+1)
		if l.Model == "" || l.File == "" {
			bad("%s: model and file are required", at)
		}
		if l.File != "" && !filepath.IsAbs(l.File) {
			bad("%s: file %q must be an absolute path", at, l.File)
		}
		name := l.ModelName
		if name == "" {
			name = l.Model
		}
		dup("litellm", "file "+l.File+" model_name "+name)
		cmd := strings.Join(l.Command, "\x00")
		if prev, ok := commands[l.File]; ok && prev != cmd {
			bad("%s: the [[litellm]] tables writing %s name different commands; give them one", at, l.File)
		}
		commands[l.File] = cmd
	}
	return errors.Join(errs...)
}

// ClusterName is the Envoy cluster name: cluster, or the model name.
func (e Envoy) ClusterName() string {
	if e.Cluster != "" {
		return e.Cluster
	}
	return e.Model
}

// Token reads the coordinator token file ("" when none is configured).
// Like the coordinator's own token files, it must not be readable by
// others nor writable by its group.
func (c Config) Token() (string, error) {
	path := c.Coordinator.TokenFile
	if path == "" {
		return "", nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("[coordinator] token_file: %w", err)
	}
	if perm := st.Mode().Perm(); runtime.GOOS != "windows" && perm&0o027 != 0 {
		return "", fmt.Errorf("[coordinator] token_file %s has mode %04o; run: chmod 600 %s (or 640 with a dedicated group)", path, perm, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("[coordinator] token_file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" || strings.ContainsAny(tok, "\r\n") || len(tok) > 4096 {
		return "", fmt.Errorf("[coordinator] token_file %s must hold one token on one line", path)
	}
	return tok, nil
}

// TLS returns the TLS settings for an https:// coordinator: nil for the
// system roots, or a pool of the ca_file's certificates.
func (c Config) TLS() (*tls.Config, error) {
	if c.Coordinator.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.Coordinator.CAFile)
	if err != nil {
		return nil, fmt.Errorf("[coordinator] ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("[coordinator] ca_file %s holds no PEM certificate", c.Coordinator.CAFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}
