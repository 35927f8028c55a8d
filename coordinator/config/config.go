// Package config loads heft-coordinator's configuration through the one
// mechanism every heft binary uses (heft/shared/settings): defaults, then a
// TOML file, then HEFT_COORDINATOR_* environment variables, then flags.
// Each setting is one row of settings(). Secrets may come from files; those
// files must not be readable by anyone but their owner and group.
package config

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/coordinator/server"
	"heft/shared/logging"
	"heft/shared/settings"
)

// EnvPrefix starts every environment variable the coordinator reads.
const EnvPrefix = "HEFT_COORDINATOR_"

// Config is the coordinator's whole configuration. Durations are written as
// strings such as "30s" or "6h" in TOML, the environment and flags.
type Config struct {
	Listen   string
	StateDir string
	// AgentCheckListen, when set, answers HAProxy agent checks there
	// (server.ServeAgentCheck): heft's weights without heft-sync.
	AgentCheckListen string

	AgentToken      string
	AgentTokenFile  string
	AdminToken      string
	AdminTokenFile  string
	ViewerToken     string // optional: when set, reads need it
	ViewerTokenFile string

	// TrustedProxies are addresses or CIDR prefixes of proxies whose
	// X-Forwarded-For header names the client.
	TrustedProxies []string
	// AdvertiseAllow lists the addresses (CIDR, ADDRESS, NODE=CIDR,
	// NODE=ADDRESS) nodes may offer gateways besides the one each
	// connects from.
	AdvertiseAllow []string
	// DPDeployments bind multi-node data-parallel deployments' addresses
	// to the nodes allowed to join them ([[dp_deployment]]); coordinator.New
	// hands them to the fleet (Fleet.BindDeployments).
	DPDeployments []fleet.DeploymentBinding

	LogLevel string
	LogJSON  bool

	// Fleet, Nodes and Server are those packages' own settings: each row
	// of command() binds straight into a field of theirs, and each package
	// validates its own (Validate calls them). Server holds what the file
	// sets (TLS files, pings, connection caps); coordinator.New adds what
	// is read or derived: the tokens, the parsed proxies and advertise
	// rules, the pin range and the parts it assembles.
	Fleet  fleet.Config
	Nodes  nodes.Config
	Server server.Options

	// Init lets the coordinator start over on an empty state file, or
	// recreate the missing buckets of a damaged one (--init).
	Init bool

	// ShowVersion is set by --version; Load then reads nothing else.
	ShowVersion bool

	// report says where each setting came from; nil unless Load made c.
	report *settings.Report
}

// Default returns the configuration used where nothing else is said. The
// fleet's, the registry's and the server's settings default to what those
// packages define.
func Default() Config {
	return Config{
		Listen:   "127.0.0.1:7070",
		StateDir: "/var/lib/heft",
		LogLevel: logging.DefaultLevel,
		Fleet:    fleet.DefaultConfig(),
		Nodes:    nodes.DefaultConfig(),
		Server: server.Options{
			PingInterval: server.DefaultPingInterval, PingTimeout: server.DefaultPingTimeout,
			MaxAgentConnections: server.DefaultMaxAgentConnections, MaxEventStreams: server.DefaultMaxEventStreams,
			MaxAPIRequests: server.DefaultMaxAPIRequests,
		},
	}
}

// command is the coordinator's command line and configuration, bound to c:
// one row per setting. A new setting is a field above and a row here.
func (c *Config) command() settings.Command {
	tokenFile := "(mode 0600, or 0640 with a dedicated group)"
	return settings.Command{
		Name:      "heft-coordinator",
		Synopsis:  "heft-coordinator [--config FILE] [flags]\n       heft-coordinator gen-token   (print a new random token)\n       heft-coordinator backup [--config FILE] [flags] BACKUP_FILE   (copy the running coordinator's state)",
		About:     "Keeps the fleet: agents report to it, it measures and weighs the workers, and serves\nthe weights, a dashboard, a JSON API and Prometheus metrics.",
		EnvPrefix: EnvPrefix,
		Version:   true,
		Settings: []settings.Setting{
			settings.String("listen", &c.Listen, "host:port to serve HTTP on").Meta("ADDR"),
			settings.String("state_dir", &c.StateDir, "directory for persistent state").Meta("DIR"),
			settings.String("agent_check_listen", &c.AgentCheckListen, "host:port to answer HAProxy agent checks on (off when empty)").Meta("ADDR"),
			settings.String("agent_token", &c.AgentToken, "the agents' token").Secret().Flag("-"),
			settings.String("agent_token_file", &c.AgentTokenFile, "file holding the agents' token "+tokenFile).Meta("FILE"),
			settings.String("admin_token", &c.AdminToken, "the admin token").Secret().Flag("-"),
			settings.String("admin_token_file", &c.AdminTokenFile, "file holding the admin token "+tokenFile).Meta("FILE"),
			settings.String("viewer_token", &c.ViewerToken, "the optional viewer token").Secret().Flag("-"),
			settings.String("viewer_token_file", &c.ViewerTokenFile, "file holding the optional viewer token "+tokenFile).Meta("FILE"),
			settings.String("tls_cert_file", &c.Server.TLSCertFile, "TLS certificate (PEM); with --tls-key-file, serve HTTPS").Meta("FILE"),
			settings.String("tls_key_file", &c.Server.TLSKeyFile, "TLS private key (PEM)").Meta("FILE"),
			settings.Strings("trusted_proxies", &c.TrustedProxies, "proxies (addresses or CIDR prefixes) whose X-Forwarded-For names the client").Meta("ADDR"),
			settings.Strings("advertise_allow", &c.AdvertiseAllow, "addresses nodes may offer gateways besides the one each connects from: CIDR, ADDRESS, NODE=CIDR or NODE=ADDRESS").Meta("RULE"),
			settings.List("dp_deployment", &c.DPDeployments,
				"a multi-node data-parallel deployment's address and the only nodes whose workers join it, repeatable; replaces the file's tables",
				settings.ListOf[fleet.DeploymentBinding]{Fields: func(b *fleet.DeploymentBinding) []settings.Setting {
					return []settings.Setting{settings.String("address", &b.Address, ""), settings.Strings("nodes", &b.Nodes, "")}
				}, Parse: fleet.ParseDeploymentBinding}).Meta(fleet.DeploymentBindingSyntax),
			settings.String("log_level", &c.LogLevel, strings.Join(logging.Levels, ", ")).Meta("LEVEL"),
			settings.Bool("log_json", &c.LogJSON, "log JSON lines even on a terminal"),
			settings.Duration("offline_grace", &c.Fleet.OfflineGrace, "how long an agent may be gone before its workers show stale (still routed) or offline"),
			settings.Duration("stale_weight_ttl", &c.Fleet.StaleWeightTTL, "how long a worker whose agent is gone keeps its last weight, from the disconnect (0: cache_ttl)"),
			settings.Duration("agent_ping_interval", &c.Server.PingInterval, "how often each agent connection is pinged"),
			settings.Duration("agent_ping_timeout", &c.Server.PingTimeout, "how long a ping may go unanswered, with no other message from the agent, before the agent is dropped"),
			settings.Duration("cache_ttl", &c.Fleet.CacheTTL, "how long a measurement is reused across reconnects"),
			settings.Duration("remeasure_every", &c.Fleet.RemeasureEvery, "how often an idle worker is measured again"),
			settings.Float("weight_min", &c.Fleet.WeightMin, "smallest weight"),
			settings.Float("weight_max", &c.Fleet.WeightMax, "largest weight"),
			settings.Float("thresholds.pool_hold", &c.Fleet.Thresholds.PoolHold, "smallest/largest DP pool below which a worker is held"),
			settings.Float("thresholds.pool_warn", &c.Fleet.Thresholds.PoolWarn, "smallest/largest DP pool below which a worker gets a warning"),
			settings.Float("thresholds.clock_low", &c.Fleet.Thresholds.ClockLow, "median/max SM clock during a probe below which a worker gets a warning"),
			settings.Uint64("thresholds.foreign_min_bytes", &c.Fleet.Thresholds.ForeignMinBytes, "foreign GPU processes holding less memory are ignored").Meta("BYTES"),
			settings.Bool("single_host", &c.Fleet.SingleHost, "every gateway runs on this host: engines offered at a loopback address are routable (no not_routable warning)"),
			settings.Bool("approve_new_nodes", &c.Nodes.ApproveNew, "a new node name waits for an admin's approval before its workers count"),
			settings.Bool("require_node_credential", &c.Nodes.RequireCredential, "refuse agents too old to keep a node credential"),
			settings.Int("max_nodes", &c.Nodes.MaxNodes, "node names remembered at most (every state)"),
			settings.Int("max_pending_nodes", &c.Nodes.MaxPending, "node names awaiting approval at most; the oldest goes first"),
			settings.Duration("forget_nodes_after", &c.Nodes.ForgetAfter, "a node name unseen this long is forgotten, credential and all"),
			settings.Int("new_nodes_per_minute_per_token", &c.Nodes.NewPerToken, "new node names enrolled a minute with one agent token, at most; known names reconnecting are never limited (0: no bound)"),
			settings.Int("new_nodes_per_minute_per_address", &c.Nodes.NewPerAddress, "new node names enrolled a minute from one source address, at most (0: no bound)"),
			settings.Int("max_keys_per_node", &c.Fleet.MaxKeysPerNode, "capacity keys remembered per node; past it the least recently listed is forgotten"),
			settings.Float("plausibility.factor", &c.Fleet.ImplausibleFactor, "a throughput above this × its model's median is held as implausible (0: off)"),
			settings.Float("plausibility.max_tps_per_gpu", &c.Fleet.MaxTPSPerGPU, "a throughput above this per GPU is held as implausible (0: off)"),
			settings.Float("plausibility.max_stream_tps", &c.Fleet.MaxStreamTPS, "a throughput above this per request's stream is held as implausible (0: off)"),
			settings.Duration("probation", &c.Fleet.Probation, "a new worker's weight is at most 1 and not counted in its model's median until this long after it was first seen and two measurements agree, or an admin admits it (0: off)"),
			settings.Float("plausibility.max_node_share", &c.Fleet.MaxNodeShare, "the largest share of a model's weight one node's workers hold once the model has 3 nodes (0: off)"),
			settings.Int("max_agent_connections", &c.Server.MaxAgentConnections, "agent websockets at once; past it new ones get 503"),
			settings.Int("max_event_streams", &c.Server.MaxEventStreams, "event streams (dashboards, heft-sync) at once; past it new ones get 503"),
			settings.Int("max_api_requests", &c.Server.MaxAPIRequests, "other API requests in flight at once; past it new ones get 503"),
			settings.Bool("init", &c.Init, "start over on an empty state file, or recreate the missing buckets of a damaged one").FlagOnly(),
		},
		Alternatives: [][]string{
			{"agent_token", "agent_token_file"}, {"admin_token", "admin_token_file"}, {"viewer_token", "viewer_token_file"},
		},
	}
}

// String describes the configuration without its secrets, so a stray
// log line or %v cannot leak a token.
func (c Config) String() string { return c.command().Describe() }

// GoString keeps %#v as quiet about secrets as %v.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// TLS reports whether the HTTP server should serve TLS.
func (c Config) TLS() bool { return c.Server.TLS() }

// Tokens are the secrets in force after token files have been read. Each
// may hold several tokens, one a line (settings.SplitTokens), as a token
// file does during a rotation; any of them is accepted.
type Tokens struct {
	Agent  string
	Admin  string // empty: admin actions are refused
	Viewer string // empty: reads need no token
}

// ReadTokens returns the tokens, reading token files where configured.
func (c Config) ReadTokens() (Tokens, error) {
	var t Tokens
	var errs []error
	for _, s := range c.secrets() {
		v, err := s.resolve()
		if err != nil {
			errs = append(errs, err)
		}
		*s.dst(&t) = v
	}
	return t, errors.Join(errs...)
}

type secret struct {
	key, value, fileKey, file string
	dst                       func(*Tokens) *string
}

func (c Config) secrets() []secret {
	return []secret{
		{"agent_token", c.AgentToken, "agent_token_file", c.AgentTokenFile, func(t *Tokens) *string { return &t.Agent }},
		{"admin_token", c.AdminToken, "admin_token_file", c.AdminTokenFile, func(t *Tokens) *string { return &t.Admin }},
		{"viewer_token", c.ViewerToken, "viewer_token_file", c.ViewerTokenFile, func(t *Tokens) *string { return &t.Viewer }},
	}
}

func (s secret) resolve() (string, error) {
	switch {
	case s.value != "" && s.file != "":
		return "", fmt.Errorf("%s and %s are both set; keep one", s.key, s.fileKey)
	case s.file != "":
		toks, err := settings.ReadTokensFile(s.file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", s.fileKey, err)
		}
		return strings.Join(toks, "\n"), nil
	default:
		return s.value, nil
	}
}

// Validate returns every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen %q is not host:port: %v", c.Listen, err)
	}
	if c.AgentCheckListen != "" {
		if _, _, err := net.SplitHostPort(c.AgentCheckListen); err != nil {
			bad("agent_check_listen %q is not host:port: %v", c.AgentCheckListen, err)
		} else if c.AgentCheckListen == c.Listen {
			bad("agent_check_listen %q is the HTTP listen address: give it a port of its own", c.AgentCheckListen)
		}
	}
	if strings.TrimSpace(c.StateDir) == "" {
		bad("state_dir is empty")
	}
	tokens, err := c.ReadTokens()
	if err != nil {
		errs = append(errs, err)
	}
	if c.AgentToken == "" && c.AgentTokenFile == "" {
		bad("agent_token (or agent_token_file) is required: agents authenticate with it")
	}
	if err := c.CheckTokens(tokens); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.Proxies(); err != nil {
		bad("%v", err)
	}
	if _, err := server.ParseAllow(c.AdvertiseAllow); err != nil {
		bad("%v", err)
	}
	if err := fleet.CheckDeploymentBindings(c.DPDeployments); err != nil {
		errs = append(errs, err)
	}
	if shareToken(tokens.Agent, tokens.Admin) {
		bad("admin_token must differ from agent_token, or every agent could act as an admin")
	}
	if (c.Server.TLSCertFile == "") != (c.Server.TLSKeyFile == "") {
		bad("tls_cert_file and tls_key_file must be set together")
	}
	for _, f := range []struct{ key, path string }{{"tls_cert_file", c.Server.TLSCertFile}, {"tls_key_file", c.Server.TLSKeyFile}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			bad("%s: %v", f.key, err)
		}
	}
	if err := logging.CheckLevel(c.LogLevel); err != nil {
		bad("log_level: %v", err)
	}
	errs = append(errs, c.Fleet.Validate(), c.Nodes.Validate(), c.Server.Validate())
	return errors.Join(errs...)
}

// CheckTokens refuses tokens shorter than MinTokenBytes, naming the file
// each came from; Validate and a reload (SIGHUP) use it.
func (c Config) CheckTokens(tokens Tokens) error {
	var errs []error
	for _, s := range c.secrets() {
		for _, v := range settings.SplitTokens(*s.dst(&tokens)) {
			if len(v) >= MinTokenBytes {
				continue
			}
			what := s.key
			if s.file != "" {
				what = fmt.Sprintf("a token in %s (%s)", s.fileKey, s.file)
			}
			errs = append(errs, fmt.Errorf("%s is %d bytes; at least %d are needed so that it cannot be guessed: run `heft-coordinator gen-token` for one",
				what, len(v), MinTokenBytes))
		}
	}
	return errors.Join(errs...)
}

// shareToken reports whether two token lists have a token in common.
func shareToken(a, b string) bool {
	bs := settings.SplitTokens(b)
	for _, t := range settings.SplitTokens(a) {
		if slices.Contains(bs, t) {
			return true
		}
	}
	return false
}

// MinTokenBytes is the shortest token the coordinator accepts.
const MinTokenBytes = 32

// NewToken returns a token of 32 random bytes, URL-safe base64 (43
// characters), for `heft-coordinator gen-token`.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Proxies parses trusted_proxies: addresses (a single host) or CIDR
// prefixes.
func (c Config) Proxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range c.TrustedProxies {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("trusted_proxies: %q is neither an address nor a CIDR prefix", s))
			continue
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, errors.Join(errs...)
}

// EnvName is the environment variable for a TOML key.
func EnvName(key string) string { return settings.EnvName(EnvPrefix, key) }

// FlagName is the command-line flag for a TOML key.
func FlagName(key string) string { return settings.FlagName(key) }

// Load builds the configuration from defaults, the TOML file at path (or
// the one named by --config, or by HEFT_COORDINATOR_CONFIG), the
// environment and args, then validates it. env is usually os.Getenv.
// Command-line mistakes are a *settings.UsageError (flag.ErrHelp for -h);
// for --version, Load returns a Config with ShowVersion set.
func Load(path string, args []string, env func(string) string) (Config, error) {
	cfg := Default()
	rep, err := cfg.command().Load(path, args, env)
	if errors.Is(err, settings.ErrVersion) {
		return Config{ShowVersion: true}, nil
	}
	if err != nil {
		return Config{}, err
	}
	cfg.report = rep
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// LogSettings writes the start-up lines that say where each setting that
// is not at its default came from, and warn of any value that overrode a
// different one (--state-dir over the file's state_dir).
func (c Config) LogSettings(logger hclog.Logger) { c.report.Log(logger) }

// Usage describes the flags and their environment variables.
func Usage() string {
	var b strings.Builder
	PrintUsage(&b)
	return b.String()
}

// PrintUsage writes Usage to w.
func PrintUsage(w io.Writer) {
	c := Default()
	c.command().Usage(w)
}

// ApproveNewNodesSet reports whether the configuration says whether new
// node names wait for approval. When it does not, the state file decides
// (coordinator.New): on for a new install, off for an upgrade, which
// keeps the default it was installed with. A Config not made by Load
// (config.Default() in a program or a test) says every setting itself.
func (c Config) ApproveNewNodesSet() bool {
	if c.report == nil {
		return true
	}
	o, ok := c.report.Origin("approve_new_nodes")
	return !ok || o.Source != settings.FromDefault
}
