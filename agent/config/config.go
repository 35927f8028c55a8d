// Package config loads heft-agent's configuration through the one
// mechanism every heft binary uses (heft/shared/settings): defaults, then a
// TOML file, then HEFT_* environment variables, then command-line flags,
// each layer overriding the one before. Each setting is one row of
// command(); Validate reports every problem at once.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/link"
	"heft/agent/logsource"
	"heft/agent/probe"
	"heft/shared/address"
	"heft/shared/grammar"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/wire"
)

// Coordinator says where the agent reports and how it proves who it is.
type Coordinator struct {
	URL       string
	Token     string
	TokenFile string
	// CAFile is a PEM bundle trusted for a wss:// coordinator, in addition
	// to nothing else: when set, the system roots are not used.
	CAFile             string
	InsecureSkipVerify bool
}

// Node names this host to the coordinator.
type Node struct {
	Name string
}

// Engine is one inference engine endpoint beside the agent.
type Engine struct {
	Kind string
	URL  string
	// Log is the engine's start-up log, optional.
	Log string
	// Model overrides the served model name, optional.
	Model string
	// AdvertiseURL is the engine's URL as gateways dial it, optional;
	// URL is what the agent dials. Without it the agent offers one it
	// derives (engine.Config.AdvertiseURL says how).
	AdvertiseURL string
}

// EngineLogs say where this host keeps what the engines' log sources read
// (the [engine_logs] table): the defaults are a stock host's.
type EngineLogs struct {
	// JournalDirectory makes journald: sources read the journal files in
	// this folder (journalctl --directory) instead of the system journal:
	// a host's journal mounted into the agent's container.
	JournalDirectory string
	// DockerSocket is the Docker Engine API's unix socket, for docker:.
	DockerSocket string
	// DockerRoot is Docker's data root, whose json-file logs docker:
	// reads directly when the socket cannot be used.
	DockerRoot string
	// PodsRoot holds the kubelet's pod logs, for k8s:.
	PodsRoot string
}

// Probe shapes the measurement burst, and the prefill burst after it.
type Probe struct {
	// Concurrency is the burst per data-parallel rank: a DP-N engine is
	// measured with N times as many requests, so every rank carries it.
	Concurrency int
	Tokens      int
	Prompt      string
	// Prefill sends the prefill burst in every probe.
	Prefill            bool
	PrefillConcurrency int
	PrefillTokens      int
	// Busy is what a probe does with an engine that has requests running
	// or waiting: probe.BusyWait, BusyDrain or BusyPassiveOnly.
	Busy string
	// BusyWait bounds the wait for an idle engine.
	BusyWait time.Duration
	// PassiveWindow is how long an engine must stay saturated for its
	// delivered tokens/s to count as a passive capacity reading.
	PassiveWindow time.Duration
	// PaceWindow is how long the counters are read for one pace reading
	// (one every half window), at any load.
	PaceWindow time.Duration
}

// Log configures the agent's own logging.
type Log struct {
	Level string
	JSON  bool
}

// Config is the whole agent configuration.
type Config struct {
	Coordinator Coordinator
	Node        Node
	Engines     []Engine
	EngineLogs  EngineLogs
	Probe       Probe
	Log         Log
	// SnapshotInterval is the heartbeat: a snapshot is sent at least this often.
	// StateDir is where the agent keeps what must survive a restart: the
	// node credential the coordinator hands it at enrolment.
	StateDir string

	SnapshotInterval time.Duration
	// PollInterval is how often facts are compared to spot a change.
	PollInterval time.Duration
	// Listen is where /metrics and /healthz are served, host:port; "" is
	// off (the default: the agent opens no port unless asked).
	Listen string
	// Discover makes run find the engines on this host itself, besides
	// those configured (agent/discover says how).
	Discover bool

	// Path is the file the config was read from, "" when none.
	Path string

	// report says where each setting came from; nil unless Load made c.
	report *settings.Report
	// hostName is the host name Default took as the node name, so that a
	// bad one is reported as the host's rather than as a setting.
	hostName string
}

// Default returns the configuration before any file, env or flag. Each
// default belongs to the package whose behaviour it sets.
func Default() Config {
	host, _ := hostname()
	return Config{
		hostName: host,
		Node:     Node{Name: host},
		EngineLogs: EngineLogs{DockerSocket: logsource.DefaultDockerSocket, DockerRoot: logsource.DefaultDockerRoot,
			PodsRoot: logsource.DefaultPodsRoot},
		Probe: Probe{Concurrency: probe.DefaultConcurrency, Tokens: probe.DefaultTokens,
			Prefill: true, PrefillConcurrency: probe.DefaultPrefillConcurrency, PrefillTokens: probe.DefaultPrefillTokens,
			Busy: probe.BusyWait, BusyWait: probe.DefaultBusyWait, PassiveWindow: DefaultPassiveWindow, PaceWindow: DefaultPaceWindow},
		Log:              Log{Level: logging.DefaultLevel},
		StateDir:         DefaultStateDir,
		SnapshotInterval: link.DefaultSnapshotEvery,
		PollInterval:     link.DefaultPollEvery,
	}
}

// hostname is os.Hostname; tests replace it.
var hostname = os.Hostname

// MinPollInterval is the shortest poll_interval: each poll reads every
// engine and GPU, so a shorter one only spins a CPU.
const MinPollInterval = 100 * time.Millisecond

// DefaultStateDir is the packaged unit's StateDirectory=heft-agent.
const DefaultStateDir = "/var/lib/heft-agent"

// DefaultPassiveWindow is how long an engine must stay saturated (every
// rank at the burst's concurrency, work waiting) before its delivered
// tokens/s count as a passive reading; MinPassiveWindow keeps a reading
// longer than the agent's one-second load polls.
const (
	DefaultPassiveWindow = 30 * time.Second
	MinPassiveWindow     = 2 * time.Second
)

// DefaultPaceWindow is a pace reading's window. A slowdown the GPU does
// not report is followed by pace alone, readings half a window apart,
// each with its newest half: at 10 s the weight first moved 3-4 s after it
// in bench area 11, on a far slower newest half (30 s windows took 29-37 s,
// and the fleet's p95 paid for the wait). Real engines'
// decode pace over 10 s stays within 14 % of its neighbours
// (testdata/pace-wild); prompts read in the window are what move it, and
// the coordinator takes their share out (coordinator/fleet/pace.go).
const DefaultPaceWindow = 10 * time.Second

// EngineSyntax is how an engine is written on the command line and in
// HEFT_ENGINES (entries separated by ';').
const EngineSyntax = "KIND=URL[,log=SOURCE][,model=NAME][,advertise=URL]"

// command is heft-agent run's command line and configuration, bound to c:
// one row per setting. A new setting is a field above and a row here.
func (c *Config) command() settings.Command {
	return settings.Command{
		Name: "heft-agent run",
		Synopsis: "heft-agent run --config FILE [--coordinator URL] [--token-file FILE] [--node NAME]\n" +
			"                      [--engine " + EngineSyntax + "]... [--log-level LEVEL] [--log-json]",
		About: "Runs the agent: reads this host's GPUs and engines, measures an engine when the\n" +
			"coordinator asks, and reports over one websocket.",
		EnvPrefix: "HEFT_",
		Settings: []settings.Setting{
			settings.String("coordinator.url", &c.Coordinator.URL, "coordinator websocket URL, e.g. wss://coord:7070/api/v1/agent").
				Flag("coordinator").Meta("URL"),
			settings.String("coordinator.token", &c.Coordinator.Token, "agent token (prefer --token-file: flags show in ps)").
				Secret().Flag("token").Env("HEFT_TOKEN").Meta("TOKEN"),
			settings.String("coordinator.token_file", &c.Coordinator.TokenFile, "file holding the agent token (mode 0600, or 0640 with a dedicated group)").
				Flag("token-file").Env("HEFT_TOKEN_FILE").Meta("FILE"),
			settings.String("coordinator.ca_file", &c.Coordinator.CAFile, "PEM file of CAs trusted for wss://").
				Flag("ca-file").Env("HEFT_CA_FILE").Meta("FILE"),
			settings.Bool("coordinator.insecure_skip_verify", &c.Coordinator.InsecureSkipVerify, "do not verify the coordinator's TLS certificate").
				Flag("insecure-skip-verify").Env("HEFT_INSECURE_SKIP_VERIFY"),
			settings.String("node.name", &c.Node.Name, "node name (default: the host name)").Flag("node").Env("HEFT_NODE").Meta("NAME"),
			settings.List("engine", &c.Engines, "an engine beside the agent, repeatable; replaces the file's engines",
				settings.ListOf[Engine]{Fields: engineFields, Parse: ParseEngine}).Env("HEFT_ENGINES").Meta(EngineSyntax),
			settings.String("engine_logs.journal_directory", &c.EngineLogs.JournalDirectory,
				"journal files that journald: logs are read from (journalctl --directory); default: the system journal").Meta("DIR"),
			settings.String("engine_logs.docker_socket", &c.EngineLogs.DockerSocket, "the Docker Engine API's socket, for docker: logs").Meta("PATH"),
			settings.String("engine_logs.docker_root", &c.EngineLogs.DockerRoot,
				"Docker's data root, whose json-file logs docker: reads when the socket cannot be used").Meta("DIR"),
			settings.String("engine_logs.pods_root", &c.EngineLogs.PodsRoot, "the kubelet's pod logs, for k8s: logs").Meta("DIR"),
			settings.Int("probe.concurrency", &c.Probe.Concurrency, "concurrent requests in a probe burst, per data-parallel rank"),
			settings.Int("probe.tokens", &c.Probe.Tokens, "output tokens per probe request"),
			settings.String("probe.prompt", &c.Probe.Prompt, "probe prompt (default: the probe package's)"),
			settings.Bool("probe.prefill", &c.Probe.Prefill, "send the prefill burst (long prompts, one output token) after the decode burst"),
			settings.Int("probe.prefill_concurrency", &c.Probe.PrefillConcurrency, "concurrent requests in a prefill burst"),
			settings.Int("probe.prefill_tokens", &c.Probe.PrefillTokens, "prompt tokens per prefill request (fewer where the worker cannot hold them)"),
			settings.String("probe.busy", &c.Probe.Busy, "what a probe does with a busy engine: "+strings.Join(probe.BusyModes, " | ")+
				" (wait for it to be idle; drain it at the gateways, then wait; never probe it)").Meta("MODE"),
			settings.Duration("probe.busy_wait", &c.Probe.BusyWait, "how long a probe waits for a busy engine to be idle before it gives up"),
			settings.Duration("probe.passive_window", &c.Probe.PassiveWindow, "how long an engine must stay saturated for a passive capacity reading (shorter: faster to follow a change, noisier)"),
			settings.Duration("probe.pace_window", &c.Probe.PaceWindow, "how long the engine's counters are read for one pace reading, one every half window (shorter: a slower engine is followed sooner, noisier)"),
			settings.String("log.level", &c.Log.Level, strings.Join(logging.Levels, ", ")).Meta("LEVEL"),
			settings.Bool("log.json", &c.Log.JSON, "log JSON lines even on a terminal"),
			settings.String("state_dir", &c.StateDir, "directory for the node credential (the packaged unit's StateDirectory)").Meta("DIR"),
			settings.Duration("snapshot_interval", &c.SnapshotInterval, "heartbeat: a snapshot at least this often"),
			settings.Duration("poll_interval", &c.PollInterval, "how often to look for changed facts"),
			settings.Bool("discover", &c.Discover, "find the engines on this host (their processes, default ports, launch arguments and logs) besides the configured ones; what is found is logged at start").Flag("discover").Env("HEFT_DISCOVER"),
			settings.String("listen", &c.Listen, "serve /metrics and /healthz on this host:port, e.g. 127.0.0.1:7071 (default: off)").Meta("ADDR"),
		},
		Alternatives: [][]string{{"coordinator.token", "coordinator.token_file"}},
	}
}

// engineFields are the keys of an [[engine]] table.
func engineFields(e *Engine) []settings.Setting {
	return []settings.Setting{
		settings.String("kind", &e.Kind, strings.Join(wire.EngineKinds, " | ")),
		settings.String("url", &e.URL, "the engine's base URL"),
		settings.String("log", &e.Log, "the engine's start-up log, optional: "+logsource.Usage),
		settings.String("model", &e.Model, "the served model name, optional"),
		settings.String("advertise_url", &e.AdvertiseURL, "the URL gateways dial for this engine, optional (default: the engine URL when its host is routable, else this node's primary address when the engine listens on every interface)"),
	}
}

// Read builds a Config from defaults, the TOML file at path ("" for none),
// the environment (env is os.Getenv in production) and the flags in args,
// without validating it: for tools that need only part of it (inspect).
// A --config flag in args names the file, else path, else HEFT_CONFIG.
// Command-line mistakes are a *FlagError (wrapping flag.ErrHelp for -h).
func Read(path string, args []string, env func(string) string) (Config, error) {
	cfg := Default()
	rep, err := cfg.command().Load(path, args, env)
	if err != nil {
		return Config{}, err
	}
	cfg.report, cfg.Path = rep, rep.Path
	return cfg, nil
}

// Load is Read, then Validate: the configuration heft-agent run needs.
func Load(path string, args []string, env func(string) string) (Config, error) {
	cfg, err := Read(path, args, env)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Parse reads TOML text into cfg on top of its current values, rejecting
// keys that match no setting.
func (c *Config) Parse(text string) error { return c.command().Parse(text) }

// FlagError is a mistake on the command line (a usage error), as opposed
// to a bad file or environment. It wraps flag.ErrHelp for -h.
type FlagError = settings.UsageError

// EnvVars lists the environment variables Load reads.
func EnvVars() []string {
	c := Default()
	return c.command().EnvVars()
}

// Usage writes heft-agent run's help: synopsis, flags, environment.
func Usage(w io.Writer) { helpConfig().command().Usage(w) }

// PrintFlags writes the flags Load understands, with their environment
// variables and defaults, for a usage message.
func PrintFlags(w io.Writer) { helpConfig().command().PrintFlags(w) }

// helpConfig holds the defaults help shows: the node name's default is
// "the host name", whatever host the help is read on.
func helpConfig() *Config {
	c := Default()
	c.Node.Name = ""
	return &c
}

// LogSettings writes the start-up lines that say where each setting that
// is not at its default came from, and warn of any value that overrode a
// different one.
// The coordinator URL as dialled follows them when the agent completed it.
func (c Config) LogSettings(logger hclog.Logger) {
	c.report.Log(logger)
	if _, note, err := c.AgentURL(); err == nil && note != "" {
		logger.Info("settings: " + note)
	}
}

// AgentURL returns the coordinator URL the agent dials: the one given,
// with ws(s):// for http(s):// and the agent endpoint's path when it has
// none (what people type is the coordinator's address), and a note when
// it differs from the one given.
func (c Config) AgentURL() (string, string, error) {
	return address.WebsocketURL("coordinator URL", c.Coordinator.URL, link.AgentPath)
}

// checkListen accepts "" (off) or host:port; an empty host is every
// interface, and port 0 a free port (for tests).
func checkListen(listen string) error {
	if listen == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("listen %q: want host:port, e.g. 127.0.0.1:7071: %w", listen, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("listen %q: port %q is not 0..65535", listen, port)
	}
	return nil
}

// String describes the configuration without its secrets, so a stray log
// line or %v cannot leak the token.
func (c Config) String() string { return c.command().Describe() }

// GoString keeps %#v as quiet about secrets as %v.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// ParseEngine reads an engine in flag syntax: EngineSyntax.
func ParseEngine(spec string) (Engine, error) {
	parts := strings.Split(strings.TrimSpace(spec), ",")
	kind, u, ok := strings.Cut(parts[0], "=")
	if !ok || kind == "" || u == "" {
		return Engine{}, fmt.Errorf("engine %q: want %s", spec, EngineSyntax)
	}
	e := Engine{Kind: strings.TrimSpace(kind), URL: strings.TrimSpace(u)}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		switch k = strings.TrimSpace(k); {
		case !ok:
			return Engine{}, fmt.Errorf("engine %q: %q is not key=value", spec, p)
		case k == "log":
			e.Log = strings.TrimSpace(v)
		case k == "model":
			e.Model = strings.TrimSpace(v)
		case k == "advertise":
			e.AdvertiseURL = strings.TrimSpace(v)
		default:
			return Engine{}, fmt.Errorf("engine %q: unknown option %q (want log, model or advertise)", spec, k)
		}
	}
	return e, nil
}

// Validate reports every problem in the configuration, joined.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Coordinator.URL == "" {
		add("no coordinator URL: set [coordinator] url, HEFT_COORDINATOR_URL or --coordinator")
	} else if _, _, err := c.AgentURL(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.Coordinator.Token != "" && c.Coordinator.TokenFile != "":
		add("both token and token_file are set: keep one")
	case c.Coordinator.Token == "" && c.Coordinator.TokenFile == "":
		add("no agent token: set [coordinator] token or token_file, HEFT_TOKEN, HEFT_TOKEN_FILE or --token-file")
	case c.Coordinator.TokenFile != "":
		if _, err := c.Token(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Coordinator.CAFile != "" {
		if _, err := c.TLSConfig(); err != nil {
			errs = append(errs, err)
		}
	}
	// The coordinator refuses a node name outside its grammar; refused
	// here, the agent says so before it dials.
	switch err := grammar.NodeName(c.Node.Name); {
	case strings.TrimSpace(c.Node.Name) == "":
		add("no node name: set [node] name, HEFT_NODE or --node")
	case err != nil && c.Node.Name == c.hostName:
		add("the host name %q cannot be the node name (%w): set [node] name, HEFT_NODE or --node", c.Node.Name, err)
	case err != nil:
		add("%w: set [node] name, HEFT_NODE or --node to such a name", err)
	}
	if len(c.Engines) > wire.MaxEngines {
		add("%d engines configured, at most %d", len(c.Engines), wire.MaxEngines)
	}
	ids := map[string]int{} // engine number by EngineID
	for i, e := range c.Engines {
		if j, dup := ids[EngineID(e.URL)]; dup {
			add("engine %d: %s is the engine of engine %d (%s), spelled another way: one engine would be reported and probed as two",
				i+1, e.URL, j, c.Engines[j-1].URL)
		} else {
			ids[EngineID(e.URL)] = i + 1
		}
		if !slices.Contains(wire.EngineKinds, e.Kind) {
			add("engine %d: unknown kind %q (want one of %s)", i+1, e.Kind, strings.Join(wire.EngineKinds, ", "))
		}
		if _, err := address.CheckURL("url", e.URL, "http", "https"); err != nil {
			add("engine %d: %w", i+1, err)
		}
		if e.Log != "" {
			if _, err := logsource.Parse(e.Log); err != nil {
				add("engine %d: log: %w", i+1, err)
			}
		}
		if e.AdvertiseURL != "" {
			if _, err := address.CheckURL("advertise_url", e.AdvertiseURL, "http", "https"); err != nil {
				add("engine %d: %w", i+1, err)
			}
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
	if c.Probe.PrefillConcurrency < 1 || c.Probe.PrefillConcurrency > probe.MaxPrefillConcurrency {
		add("probe prefill_concurrency must be 1..%d, got %d", probe.MaxPrefillConcurrency, c.Probe.PrefillConcurrency)
	}
	if c.Probe.PrefillTokens < probe.MinPrefillTokens || c.Probe.PrefillTokens > probe.MaxPrefillTokens {
		add("probe prefill_tokens must be %d..%d, got %d", probe.MinPrefillTokens, probe.MaxPrefillTokens, c.Probe.PrefillTokens)
	}
	if !slices.Contains(probe.BusyModes, c.Probe.Busy) {
		add("probe busy must be one of %s, got %q", strings.Join(probe.BusyModes, ", "), c.Probe.Busy)
	}
	if c.Probe.BusyWait <= 0 {
		add("probe busy_wait must be positive, got %s", c.Probe.BusyWait)
	}
	if c.Probe.PassiveWindow < MinPassiveWindow {
		add("probe passive_window must be at least %s, got %s", MinPassiveWindow, c.Probe.PassiveWindow)
	}
	if c.Probe.PaceWindow < MinPassiveWindow {
		add("probe pace_window must be at least %s, got %s", MinPassiveWindow, c.Probe.PaceWindow)
	}
	if err := logging.CheckLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(c.StateDir) == "" {
		add("state_dir is empty: the agent keeps its node credential there")
	}
	if c.SnapshotInterval <= 0 {
		add("snapshot_interval must be positive, got %s", c.SnapshotInterval)
	}
	if c.PollInterval < MinPollInterval {
		add("poll_interval must be at least %s (each poll reads every engine and GPU), got %s", MinPollInterval, c.PollInterval)
	}
	if err := checkListen(c.Listen); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Token returns the agent token, reading token_file when it is set. The
// file is held to the rules of every heft token file (settings.ReadTokenFile):
// the token lets anyone impersonate this node to the coordinator.
func (c Config) Token() (string, error) {
	if c.Coordinator.TokenFile == "" {
		return c.Coordinator.Token, nil
	}
	tok, err := settings.ReadTokenFile(c.Coordinator.TokenFile)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
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
	if err != nil || (u.Scheme != "ws" && u.Scheme != "http") || address.IsLoopback(u.Hostname()) {
		return ""
	}
	return fmt.Sprintf("WARNING: the agent token is sent in plain text to %s over %s://; "+
		"anyone on the path can read it and impersonate this node. Use wss:// (TLS) for a coordinator on another host.",
		u.Host, u.Scheme)
}
