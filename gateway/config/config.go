// Package config reads heft-sync's configuration through the one mechanism
// every heft binary uses (heft/shared/settings): defaults, a TOML file,
// HEFT_SYNC_* environment variables and flags for the scalar settings,
// then validates all of it before anything runs. The gateway tables are
// read from the file only.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/envoy"
	"heft/gateway/haproxy"
	"heft/gateway/litellm"
	"heft/gateway/nginx"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/address"
	"heft/shared/logging"
	"heft/shared/settings"
)

// Config is the whole of heft-sync's configuration. Each gateway table
// binds straight into its driver's config and the Selection of workers it
// serves; Validate asks each of them for its problems.
type Config struct {
	Listen   string // heft-sync's /metrics and /healthz
	LogLevel string
	LogJSON  bool
	Resync   time.Duration // how often every target is applied again
	// Floor is what control-plane signals may not take a model below.
	Floor       syncer.Floor
	Coordinator Coordinator
	HAProxy     []HAProxy
	Nginx       []Nginx
	Envoy       []Envoy
	LiteLLM     []LiteLLM

	Path        string // the file read
	CheckOnly   bool   // --check: validate, check each gateway once, exit
	ShowVersion bool

	// report says where each setting came from; nil unless Load made c.
	report *settings.Report
}

// Coordinator is [coordinator].
type Coordinator struct {
	URL       string
	TokenFile string // optional viewer (or admin) token
	CAFile    string // optional CA for an https:// coordinator
}

// HAProxy is one [[haproxy]] table.
type HAProxy struct {
	haproxy.Config
	target.Selection
}

// Nginx is one [[nginx]] table.
type Nginx struct {
	nginx.Config
	target.Selection
}

// Envoy is one [[envoy]] table: one model served as one cluster.
type Envoy struct {
	envoy.Config
	target.Selection
}

// LiteLLM is one [[litellm]] table.
type LiteLLM struct {
	litellm.Config
	target.Selection
}

// Defaults.
const (
	DefaultListen = "127.0.0.1:9471"
	DefaultResync = 5 * time.Second
	EnvPrefix     = "HEFT_SYNC_"
)

func defaults() Config {
	return Config{Listen: DefaultListen, LogLevel: logging.DefaultLevel, Resync: DefaultResync, Floor: syncer.DefaultFloor()}
}

// command is heft-sync's command line and configuration, bound to c: one
// row per setting. A new setting is a field above and a row here.
func (c *Config) command() settings.Command {
	fileOnly := func(s settings.Setting) settings.Setting { return s.Flag("-").Env("-") }
	return settings.Command{
		Name:     "heft-sync",
		Synopsis: "heft-sync --config FILE [--check] [flags]",
		About: "Keeps gateways (HAProxy, nginx, Envoy, LiteLLM) in step with heft's weights. The gateways are\n" +
			"[[haproxy]], [[nginx]], [[envoy]] and [[litellm]] tables of the file.",
		EnvPrefix: EnvPrefix,
		Version:   true,
		Settings: []settings.Setting{
			settings.Bool("check", &c.CheckOnly, "do once what the run will do (coordinator and token, models, each gateway's check) and exit: 0 ok, 1 a step failed, 78 bad configuration").FlagOnly(),
			settings.String("listen", &c.Listen, "host:port of heft-sync's /metrics and /healthz").Meta("ADDR"),
			settings.String("log_level", &c.LogLevel, strings.Join(logging.Levels, ", ")).Meta("LEVEL"),
			settings.Bool("log_json", &c.LogJSON, "log JSON lines even on a terminal"),
			settings.Duration("resync", &c.Resync, "how often every target is applied again"),
			settings.Int("min_serving", &c.Floor.MinServing, "the fewest workers a model serves on whatever the coordinator says (agents gone, a coordinator restarted empty, holds); only an admin's explicit below-floor action goes under it; 0 turns the floor off"),
			settings.Float("min_serving_capacity", &c.Floor.MinCapacity, "the smallest share (0-1) of a model's last applied capacity (sum of weights) that control-plane signals may take away"),
			settings.Duration("keep_unlisted", &c.Floor.KeepUnlisted, "how long a serving worker the coordinator stops listing (or lists as unmeasured) keeps its last weight, so a coordinator restarted on an empty state drains nothing; 0: only the floor keeps it"),
			settings.String("coordinator.url", &c.Coordinator.URL, "the coordinator, http:// or https://").Meta("URL"),
			settings.String("coordinator.token_file", &c.Coordinator.TokenFile, "file holding a viewer (or admin) token (mode 0600, or 0640 with a dedicated group)").Meta("FILE"),
			settings.String("coordinator.ca_file", &c.Coordinator.CAFile, "PEM file of CAs trusted for an https:// coordinator").Meta("FILE"),
			fileOnly(settings.List("haproxy", &c.HAProxy, "an HAProxy backend", settings.ListOf[HAProxy]{Fields: func(h *HAProxy) []settings.Setting {
				return []settings.Setting{
					settings.String("model", &h.Model, ""), settings.String("socket", &h.Socket, ""),
					settings.String("backend", &h.Backend, ""), settings.String("slots", &h.Slots, ""),
					settings.String("order", &h.Order, ""), settings.Bool("add_servers", &h.AddServers, ""),
					settings.Bool("maxconn", &h.MaxConn, ""), settings.Duration("timeout", &h.Timeout, ""),
					settings.String("state_file", &h.StateFile, ""),
					settings.String("kind", &h.Kind, ""), settings.Int("min_context_tokens", &h.MinContextTokens, ""),
				}
			}})),
			fileOnly(settings.List("nginx", &c.Nginx, "an nginx upstream file", settings.ListOf[Nginx]{Fields: func(n *Nginx) []settings.Setting {
				return []settings.Setting{
					settings.String("model", &n.Model, ""), settings.String("file", &n.File, ""),
					settings.String("upstream", &n.Upstream, ""), settings.Strings("directives", &n.Directives, ""),
					settings.Strings("check", &n.Check, ""), settings.Strings("reload", &n.Reload, ""),
					settings.Bool("max_conns", &n.MaxConns, ""), settings.Duration("timeout", &n.Timeout, ""),
					settings.String("kind", &n.Kind, ""), settings.Int("min_context_tokens", &n.MinContextTokens, ""),
				}
			}})),
			fileOnly(settings.List("envoy", &c.Envoy, "an Envoy cluster over xDS", settings.ListOf[Envoy]{Fields: func(e *Envoy) []settings.Setting {
				return []settings.Setting{
					settings.String("listen", &e.Listen, ""), settings.String("model", &e.Model, ""),
					settings.String("cluster", &e.Cluster, ""), settings.String("state_file", &e.StateFile, ""),
					settings.String("kind", &e.Kind, ""), settings.Int("min_context_tokens", &e.MinContextTokens, ""),
				}
			}})),
			fileOnly(settings.List("litellm", &c.LiteLLM, "a LiteLLM model_list file", settings.ListOf[LiteLLM]{Fields: func(l *LiteLLM) []settings.Setting {
				return []settings.Setting{
					settings.String("model", &l.Model, ""), settings.String("file", &l.File, ""),
					settings.Strings("command", &l.Command, ""), settings.String("model_name", &l.ModelName, ""),
					settings.String("provider", &l.Provider, ""), settings.String("api_key", &l.APIKey, "").Secret(),
					settings.Duration("timeout", &l.Timeout, ""), settings.String("kind", &l.Kind, ""), settings.Int("min_context_tokens", &l.MinContextTokens, ""),
				}
			}})),
		},
	}
}

// Usage is the --help text.
func Usage() string {
	var b strings.Builder
	PrintUsage(&b)
	return b.String()
}

// PrintUsage writes Usage to w.
func PrintUsage(w io.Writer) {
	c := defaults()
	c.command().Usage(w)
}

// Load reads the file named by --config (or HEFT_SYNC_CONFIG), applies the
// environment and the flags, and validates. Command-line mistakes, and no
// file at all, are a *settings.UsageError (flag.ErrHelp for -h); for
// --version, Load returns a Config with ShowVersion set.
func Load(args []string, env func(string) string) (Config, error) {
	c := defaults()
	rep, err := c.command().Load("", args, env)
	if errors.Is(err, settings.ErrVersion) {
		return Config{ShowVersion: true}, nil
	}
	if err != nil {
		return Config{}, err
	}
	if rep.Path == "" {
		return Config{}, &settings.UsageError{Err: errors.New("no configuration: pass --config FILE (or set " + EnvPrefix + "CONFIG)")}
	}
	c.Path, c.report = rep.Path, rep
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", c.Path, err)
	}
	return c, nil
}

// Parse decodes TOML text over the defaults; unknown keys are errors.
func Parse(text string) (Config, error) {
	c := defaults()
	if err := c.command().Parse(text); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LogSettings writes the start-up lines that say where each setting that
// is not at its default came from, and warn of any value that overrode a
// different one.
func (c Config) LogSettings(logger hclog.Logger) { c.report.Log(logger) }

// String describes the configuration without its secrets (LiteLLM API keys).
func (c Config) String() string { return c.command().Describe() }

// GoString keeps %#v as quiet about secrets as %v.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// Validate returns every problem at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen %q is not host:port: %v", c.Listen, err)
	}
	if err := logging.CheckLevel(c.LogLevel); err != nil {
		bad("log_level: %v", err)
	}
	if c.Resync < 100*time.Millisecond {
		bad("resync %s is too short (at least 100ms)", c.Resync)
	}
	errs = append(errs, c.Floor.Validate())
	if c.Coordinator.URL == "" {
		bad("[coordinator] url is required, e.g. http://127.0.0.1:7070")
	} else if _, err := address.CheckURL("[coordinator] url", c.Coordinator.URL, "http", "https"); err != nil {
		errs = append(errs, err)
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
	// table names the table on each line of its config's problems.
	table := func(kind string, i int, problems ...error) {
		for _, err := range problems {
			lines := []error{err}
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				lines = j.Unwrap()
			}
			for _, e := range lines {
				if e != nil {
					bad("[[%s]] #%d: %w", kind, i+1, e)
				}
			}
		}
	}
	seen := map[string]bool{}
	dup := func(kind, key string) {
		if seen[kind+"\x00"+key] {
			bad("two [[%s]] tables name %s", kind, key)
		}
		seen[kind+"\x00"+key] = true
	}
	// Each file heft-sync keeps state in is one table's: an Envoy table's
	// state_file and its DNS answers beside it, an HAProxy table's.
	stateFiles := map[string]string{} // path → the table that keeps it
	stateFile := func(kind string, i int, path string) {
		if path == "" {
			return
		}
		path = filepath.Clean(path)
		if other, ok := stateFiles[path]; ok {
			bad("[[%s]] #%d: state file %s is also %s's: give each table its own", kind, i+1, path, other)
			return
		}
		stateFiles[path] = fmt.Sprintf("[[%s]] #%d", kind, i+1)
	}
	for i, h := range c.HAProxy {
		table("haproxy", i, h.Config.Validate(), h.Selection.Validate())
		dup("haproxy", "socket "+h.Socket+" backend "+h.Backend)
		stateFile("haproxy", i, h.StateFile)
	}
	for i, n := range c.Nginx {
		table("nginx", i, n.Config.Validate(), n.Selection.Validate())
		dup("nginx", "file "+n.File)
	}
	for i, e := range c.Envoy {
		table("envoy", i, e.Config.Validate(), e.Selection.Validate())
		dup("envoy", "listen "+e.Listen+" cluster "+e.ClusterName())
		if e.StateFile != "" {
			stateFile("envoy", i, e.StateFile)
			stateFile("envoy", i, envoy.AnswersFile(e.StateFile))
		}
	}
	commands := map[string]string{}
	for i, l := range c.LiteLLM {
		table("litellm", i, l.Config.Validate(), l.Selection.Validate())
		name := l.ModelName
		if name == "" {
			name = l.Model
		}
		dup("litellm", "file "+l.File+" model_name "+name)
		cmd := strings.Join(l.Command, "\x00")
		if prev, ok := commands[l.File]; ok && prev != cmd {
			bad("[[litellm]] #%d: the [[litellm]] tables writing %s name different commands; give them one", i+1, l.File)
		}
		commands[l.File] = cmd
	}
	return errors.Join(errs...)
}

// Token reads the coordinator token file ("" when none is configured),
// held to the rules of every heft token file (settings.ReadTokenFile).
func (c Config) Token() (string, error) {
	if c.Coordinator.TokenFile == "" {
		return "", nil
	}
	tok, err := settings.ReadTokenFile(c.Coordinator.TokenFile)
	if err != nil {
		return "", fmt.Errorf("[coordinator] token_file: %w", err)
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
