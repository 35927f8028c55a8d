// Package config loads heft-coordinator's configuration: defaults, then a
// TOML file, then HEFT_COORDINATOR_* environment variables, then flags.
// Secrets may come from files; those files must not be readable by anyone
// but their owner.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/go-hclog"

	"heft/shared/health"
)

// EnvPrefix starts every environment variable the coordinator reads.
const EnvPrefix = "HEFT_COORDINATOR_"

// Config is the coordinator's whole configuration. Durations are written as
// strings such as "30s" or "6h" in TOML, the environment and flags.
type Config struct {
	Listen   string `toml:"listen"`
	StateDir string `toml:"state_dir"`

	AgentToken      string `toml:"agent_token"`
	AgentTokenFile  string `toml:"agent_token_file"`
	AdminToken      string `toml:"admin_token"`
	AdminTokenFile  string `toml:"admin_token_file"`
	ViewerToken     string `toml:"viewer_token"` // optional: when set, reads need it
	ViewerTokenFile string `toml:"viewer_token_file"`

	TLSCertFile string `toml:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file"`

	LogLevel string `toml:"log_level"`
	LogJSON  bool   `toml:"log_json"`

	OfflineGrace time.Duration `toml:"offline_grace"`
	// AgentPingInterval and AgentPingTimeout bound how long a silently
	// stalled agent connection lingers before it is dropped.
	AgentPingInterval time.Duration `toml:"agent_ping_interval"`
	AgentPingTimeout  time.Duration `toml:"agent_ping_timeout"`
	CacheTTL          time.Duration `toml:"cache_ttl"`
	RemeasureEvery    time.Duration `toml:"remeasure_every"`

	Thresholds health.Thresholds `toml:"thresholds"`
	WeightMin  float64           `toml:"weight_min"`
	WeightMax  float64           `toml:"weight_max"`

	// ShowVersion is set by --version; Load then reads nothing else.
	ShowVersion bool `toml:"-"`
}

// Default returns the configuration used where nothing else is said.
func Default() Config {
	return Config{
		Listen:            "127.0.0.1:7070",
		StateDir:          "/var/lib/heft",
		LogLevel:          "info",
		OfflineGrace:      30 * time.Second,
		AgentPingInterval: 10 * time.Second,
		AgentPingTimeout:  5 * time.Second,
		CacheTTL:          6 * time.Hour,
		RemeasureEvery:    6 * time.Hour,
		Thresholds:        health.DefaultThresholds(),
		WeightMin:         0.25,
		WeightMax:         8,
	}
}

// String describes the configuration without its secrets, so a stray
// log line or %v cannot leak a token.
func (c Config) String() string {
	redact := func(s string) string {
		if s == "" {
			return `""`
		}
		return "[redacted]"
	}
	return fmt.Sprintf("listen=%s state_dir=%s agent_token=%s agent_token_file=%q admin_token=%s admin_token_file=%q "+
		"viewer_token=%s viewer_token_file=%q tls=%t log_level=%s offline_grace=%s cache_ttl=%s remeasure_every=%s "+
		"weights=[%g,%g]", c.Listen, c.StateDir, redact(c.AgentToken), c.AgentTokenFile, redact(c.AdminToken),
		c.AdminTokenFile, redact(c.ViewerToken), c.ViewerTokenFile, c.TLS(), c.LogLevel, c.OfflineGrace, c.CacheTTL,
		c.RemeasureEvery, c.WeightMin, c.WeightMax)
}

// GoString keeps %#v as quiet about secrets as %v.
func (c Config) GoString() string { return "config.Config{" + c.String() + "}" }

// TLS reports whether the HTTP server should serve TLS.
func (c Config) TLS() bool { return c.TLSCertFile != "" && c.TLSKeyFile != "" }

// Tokens are the secrets in force after token files have been read.
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
		return readTokenFile(s.fileKey, s.file)
	default:
		return s.value, nil
	}
}

// maxTokenFile bounds what a token file may hold; a token is a line.
const maxTokenFile = 4096

func readTokenFile(key, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s: %s is not a regular file", key, path)
	}
	// Windows has no meaningful permission bits to check. Group read is
	// allowed so root can own the file and the service's group read it
	// (root:heft 0640); group write and any access by others are not.
	if perm := st.Mode().Perm(); runtime.GOOS != "windows" && perm&0o027 != 0 {
		return "", fmt.Errorf("%s: %s has mode %04o, so others can read it or its group can change it; run: chmod 600 %s (or 640 with a dedicated group)",
			key, path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: read %s: %w", key, path, err)
	}
	if len(data) > maxTokenFile {
		return "", fmt.Errorf("%s: %s is larger than %d bytes; it should hold one token", key, path, maxTokenFile)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s: %s is empty", key, path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("%s: %s holds more than one line; it should hold one token", key, path)
	}
	return tok, nil
}

// Validate returns every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen %q is not host:port: %v", c.Listen, err)
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
	if tokens.Agent != "" && tokens.Agent == tokens.Admin {
		bad("admin_token must differ from agent_token, or every agent could act as an admin")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		bad("tls_cert_file and tls_key_file must be set together")
	}
	for key, path := range map[string]string{"tls_cert_file": c.TLSCertFile, "tls_key_file": c.TLSKeyFile} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			bad("%s: %v", key, err)
		}
	}
	if hclog.LevelFromString(c.LogLevel) == hclog.NoLevel {
		bad("log_level %q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	for key, d := range map[string]time.Duration{"offline_grace": c.OfflineGrace, "cache_ttl": c.CacheTTL,
		"remeasure_every": c.RemeasureEvery, "agent_ping_interval": c.AgentPingInterval, "agent_ping_timeout": c.AgentPingTimeout} {
		if d <= 0 {
			bad("%s must be positive, got %s", key, d)
		}
	}
	th := c.Thresholds
	if !inUnit(th.PoolHold) || !inUnit(th.PoolWarn) || th.PoolHold > th.PoolWarn {
		bad("thresholds: need 0 <= pool_hold <= pool_warn <= 1, got pool_hold=%g pool_warn=%g", th.PoolHold, th.PoolWarn)
	}
	if !inUnit(th.ClockLow) {
		bad("thresholds.clock_low must be within [0, 1], got %g", th.ClockLow)
	}
	// A weight of 1 is the median worker, so the range must hold it.
	if !finite(c.WeightMin) || !finite(c.WeightMax) || c.WeightMin <= 0 || c.WeightMin > 1 || c.WeightMax < 1 {
		bad("need 0 < weight_min <= 1 <= weight_max, got weight_min=%g weight_max=%g", c.WeightMin, c.WeightMax)
	}
	return errors.Join(errs...)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// inUnit: a fraction; 0 turns its warning off.
func inUnit(v float64) bool { return finite(v) && v >= 0 && v <= 1 }

// setting is one key that the environment and flags may set.
type setting struct {
	key    string // the TOML key, dotted for tables
	flag   bool   // also a flag; secrets are not, a command line is visible to all
	usage  string
	assign func(c *Config, v string) error
}

func settings() []setting {
	str := func(get func(*Config) *string) func(*Config, string) error {
		return func(c *Config, v string) error { *get(c) = v; return nil }
	}
	dur := func(get func(*Config) *time.Duration) func(*Config, string) error {
		return func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return err
			}
			*get(c) = d
			return nil
		}
	}
	num := func(get func(*Config) *float64) func(*Config, string) error {
		return func(c *Config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return err
			}
			*get(c) = f
			return nil
		}
	}
	return []setting{
		{"listen", true, "address to serve HTTP on (host:port)", str(func(c *Config) *string { return &c.Listen })},
		{"state_dir", true, "directory for persistent state", str(func(c *Config) *string { return &c.StateDir })},
		{"agent_token", false, "", str(func(c *Config) *string { return &c.AgentToken })},
		{"agent_token_file", true, "file holding the agents' token (mode 0600, or 0640 with a dedicated group)", str(func(c *Config) *string { return &c.AgentTokenFile })},
		{"admin_token", false, "", str(func(c *Config) *string { return &c.AdminToken })},
		{"admin_token_file", true, "file holding the admin token (mode 0600, or 0640 with a dedicated group)", str(func(c *Config) *string { return &c.AdminTokenFile })},
		{"viewer_token", false, "", str(func(c *Config) *string { return &c.ViewerToken })},
		{"viewer_token_file", true, "file holding the optional viewer token (mode 0600, or 0640 with a dedicated group)", str(func(c *Config) *string { return &c.ViewerTokenFile })},
		{"tls_cert_file", true, "TLS certificate (PEM); serve HTTPS with tls_key_file", str(func(c *Config) *string { return &c.TLSCertFile })},
		{"tls_key_file", true, "TLS private key (PEM)", str(func(c *Config) *string { return &c.TLSKeyFile })},
		{"log_level", true, "trace, debug, info, warn or error", str(func(c *Config) *string { return &c.LogLevel })},
		{"log_json", true, "log JSON lines even on a terminal (true/false)", func(c *Config, v string) error {
			b, err := strconv.ParseBool(v)
			c.LogJSON = b
			return err
		}},
		{"offline_grace", true, "how long an agent may be gone before its workers go offline", dur(func(c *Config) *time.Duration { return &c.OfflineGrace })},
		{"agent_ping_interval", true, "how often each agent connection is pinged", dur(func(c *Config) *time.Duration { return &c.AgentPingInterval })},
		{"agent_ping_timeout", true, "how long a ping may go unanswered before the agent is dropped", dur(func(c *Config) *time.Duration { return &c.AgentPingTimeout })},
		{"cache_ttl", true, "how long a measurement is reused across reconnects", dur(func(c *Config) *time.Duration { return &c.CacheTTL })},
		{"remeasure_every", true, "how often an idle worker is measured again", dur(func(c *Config) *time.Duration { return &c.RemeasureEvery })},
		{"weight_min", true, "smallest weight", num(func(c *Config) *float64 { return &c.WeightMin })},
		{"weight_max", true, "largest weight", num(func(c *Config) *float64 { return &c.WeightMax })},
		{"thresholds.pool_hold", true, "smallest/largest DP pool below which a worker is held", num(func(c *Config) *float64 { return &c.Thresholds.PoolHold })},
		{"thresholds.pool_warn", true, "smallest/largest DP pool below which a worker gets a warning", num(func(c *Config) *float64 { return &c.Thresholds.PoolWarn })},
		{"thresholds.clock_low", true, "median/max SM clock during a probe below which a worker gets a warning", num(func(c *Config) *float64 { return &c.Thresholds.ClockLow })},
		{"thresholds.foreign_min_bytes", true, "foreign GPU processes holding less memory are ignored", func(c *Config, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			c.Thresholds.ForeignMinBytes = n
			return err
		}},
	}
}

// EnvName is the environment variable for a TOML key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// FlagName is the command-line flag for a TOML key.
func FlagName(key string) string {
	return strings.NewReplacer(".", "-", "_", "-").Replace(key)
}

// Load builds the configuration from defaults, the TOML file at path (or
// the one named by --config, or by HEFT_COORDINATOR_CONFIG), the
// environment and args, then validates it. env is usually os.Getenv.
// flag.ErrHelp is returned for -h.
func Load(path string, args []string, env func(string) string) (Config, error) {
	if env == nil {
		env = func(string) string { return "" }
	}
	fs := flag.NewFlagSet("heft-coordinator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "TOML configuration file")
	showVersion := fs.Bool("version", false, "print the version and exit")
	values := map[string]*string{}
	for _, s := range settings() {
		if s.flag {
			values[s.key] = fs.String(FlagName(s.key), "", s.usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w\n%s", err, Usage())
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *showVersion {
		return Config{ShowVersion: true}, nil
	}
	cfg := Default()
	switch {
	case *configPath != "":
		path = *configPath
	case path == "":
		path = env(EnvPrefix + "CONFIG")
	}
	if path != "" {
		if err := cfg.loadFile(path); err != nil {
			return Config{}, err
		}
	}
	var errs []error
	for _, s := range settings() {
		name := EnvName(s.key)
		if v := env(name); v != "" {
			if err := s.assign(&cfg, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range settings() {
		if s.flag && set[FlagName(s.key)] {
			if err := s.assign(&cfg, *values[s.key]); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", FlagName(s.key), err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}

func (c *Config) loadFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	md, err := toml.Decode(string(data), c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("config %s: %s", path, pe.ErrorWithPosition())
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	if extra := md.Undecoded(); len(extra) > 0 {
		keys := make([]string, len(extra))
		for i, k := range extra {
			keys[i] = k.String()
		}
		return fmt.Errorf("config %s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	return nil
}

// Usage describes the flags and their environment variables.
func Usage() string {
	var b strings.Builder
	b.WriteString("usage: heft-coordinator [--config FILE] [flags]\n\nflags:\n")
	fmt.Fprintf(&b, "  %-32s %s (env %sCONFIG)\n", "--config FILE", "TOML configuration file", EnvPrefix)
	fmt.Fprintf(&b, "  %-32s %s\n", "--version", "print the version and exit")
	for _, s := range settings() {
		if s.flag {
			fmt.Fprintf(&b, "  %-32s %s (env %s)\n", "--"+FlagName(s.key), s.usage, EnvName(s.key))
		}
	}
	b.WriteString("\nsecrets from the environment only: " + EnvName("agent_token") + ", " +
		EnvName("admin_token") + ", " + EnvName("viewer_token") + "\n")
	return b.String()
}
