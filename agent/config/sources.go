package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Environment variables, each overriding the file and overridden by flags.
// HEFT_ENGINES holds engines in flag syntax separated by ';'.
var envVars = []string{
	"HEFT_CONFIG", "HEFT_COORDINATOR_URL", "HEFT_TOKEN", "HEFT_TOKEN_FILE", "HEFT_CA_FILE",
	"HEFT_INSECURE_SKIP_VERIFY", "HEFT_NODE", "HEFT_ENGINES", "HEFT_PROBE_CONCURRENCY",
	"HEFT_PROBE_TOKENS", "HEFT_PROBE_PROMPT", "HEFT_LOG_LEVEL", "HEFT_LOG_JSON",
	"HEFT_SNAPSHOT_INTERVAL", "HEFT_POLL_INTERVAL",
}

// EnvVars lists the environment variables Load reads.
func EnvVars() []string { return append([]string(nil), envVars...) }

func (c *Config) applyEnv(env func(string) string) error {
	var errs []error
	str := func(name string, dst *string) {
		if v := env(name); v != "" {
			*dst = v
		}
	}
	num := func(name string, dst *int) {
		if v := env(name); v != "" {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not a whole number", name, v))
				return
			}
			*dst = n
		}
	}
	boolean := func(name string, dst *bool) {
		if v := env(name); v != "" {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not true or false", name, v))
				return
			}
			*dst = b
		}
	}
	dur := func(name string, dst *time.Duration) {
		if v := env(name); v != "" {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s=%q is not a duration like 15s", name, v))
				return
			}
			*dst = d
		}
	}

	str("HEFT_COORDINATOR_URL", &c.Coordinator.URL)
	c.setToken(env("HEFT_TOKEN"), env("HEFT_TOKEN_FILE"))
	str("HEFT_CA_FILE", &c.Coordinator.CAFile)
	boolean("HEFT_INSECURE_SKIP_VERIFY", &c.Coordinator.InsecureSkipVerify)
	str("HEFT_NODE", &c.Node.Name)
	if v := env("HEFT_ENGINES"); strings.TrimSpace(v) != "" {
		var engines []Engine
		for spec := range strings.SplitSeq(v, ";") {
			if strings.TrimSpace(spec) == "" {
				continue
			}
			e, err := ParseEngine(spec)
			if err != nil {
				errs = append(errs, fmt.Errorf("HEFT_ENGINES: %w", err))
				continue
			}
			engines = append(engines, e)
		}
		c.Engines = engines
	}
	num("HEFT_PROBE_CONCURRENCY", &c.Probe.Concurrency)
	num("HEFT_PROBE_TOKENS", &c.Probe.Tokens)
	str("HEFT_PROBE_PROMPT", &c.Probe.Prompt)
	str("HEFT_LOG_LEVEL", &c.Log.Level)
	boolean("HEFT_LOG_JSON", &c.Log.JSON)
	dur("HEFT_SNAPSHOT_INTERVAL", &c.SnapshotInterval)
	dur("HEFT_POLL_INTERVAL", &c.PollInterval)
	return errors.Join(errs...)
}

// setToken applies a layer's token settings: a layer that names one way of
// giving the token replaces the other way from the layers below, so a
// token_file in the environment wins over a token in the file. Both set in
// the same layer stay both set, and Validate rejects that.
func (c *Config) setToken(token, file string) {
	if token == "" && file == "" {
		return
	}
	c.Coordinator.Token, c.Coordinator.TokenFile = token, file
}

// ParseEngine reads an engine in flag syntax: KIND=URL[,log=PATH][,model=NAME].
func ParseEngine(spec string) (Engine, error) {
	parts := strings.Split(strings.TrimSpace(spec), ",")
	kind, u, ok := strings.Cut(parts[0], "=")
	if !ok || kind == "" || u == "" {
		return Engine{}, fmt.Errorf("engine %q: want KIND=URL[,log=PATH][,model=NAME]", spec)
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
		default:
			return Engine{}, fmt.Errorf("engine %q: unknown option %q (want log or model)", spec, k)
		}
	}
	return e, nil
}

// engineList collects repeated --engine flags.
type engineList []Engine

func (l *engineList) String() string { return fmt.Sprint(len(*l), " engines") }
func (l *engineList) Set(s string) error {
	e, err := ParseEngine(s)
	if err != nil {
		return err
	}
	*l = append(*l, e)
	return nil
}

type flagValues struct {
	set     map[string]bool
	config  *string
	v       Config
	engines engineList
}

func newFlagSet(fv *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet("heft-agent run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("config", "", "agent config `file` (TOML)")
	fs.StringVar(&fv.v.Coordinator.URL, "coordinator", "", "coordinator websocket `URL`, e.g. wss://coord:7070/api/v1/agent")
	fs.StringVar(&fv.v.Coordinator.Token, "token", "", "agent `token` (prefer --token-file: flags show in ps)")
	fs.StringVar(&fv.v.Coordinator.TokenFile, "token-file", "", "`file` holding the agent token (mode 0600)")
	fs.StringVar(&fv.v.Coordinator.CAFile, "ca-file", "", "PEM `file` of CAs trusted for wss://")
	fs.BoolVar(&fv.v.Coordinator.InsecureSkipVerify, "insecure-skip-verify", false, "do not verify the coordinator's TLS certificate")
	fs.StringVar(&fv.v.Node.Name, "node", "", "node `name` (default: the host name)")
	fs.Var(&fv.engines, "engine", "engine `KIND=URL[,log=PATH][,model=NAME]`, repeatable; replaces the file's engines")
	fs.IntVar(&fv.v.Probe.Concurrency, "probe-concurrency", DefaultProbeConcurrency, "concurrent requests in a probe burst")
	fs.IntVar(&fv.v.Probe.Tokens, "probe-tokens", DefaultProbeTokens, "output tokens per probe request")
	fs.StringVar(&fv.v.Probe.Prompt, "probe-prompt", "", "probe prompt (default: the probe package's)")
	fs.StringVar(&fv.v.Log.Level, "log-level", DefaultLogLevel, "log `level`: trace, debug, info, warn, error")
	fs.BoolVar(&fv.v.Log.JSON, "log-json", false, "log JSON even on a terminal")
	fs.DurationVar(&fv.v.SnapshotInterval, "snapshot-interval", DefaultSnapshotInterval, "heartbeat snapshot interval")
	fs.DurationVar(&fv.v.PollInterval, "poll-interval", DefaultPollInterval, "how often to look for changed facts")
	return fs
}

// PrintFlags writes the flags Load understands, for a usage message.
func PrintFlags(w io.Writer) {
	fs := newFlagSet(&flagValues{})
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// FlagError is a mistake on the command line (a usage error), as opposed
// to a bad file or environment. It wraps flag.ErrHelp for -h.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

func parseFlags(args []string) (*flagValues, error) {
	fv := &flagValues{set: map[string]bool{}}
	fs := newFlagSet(fv)
	if err := fs.Parse(args); err != nil {
		return nil, &FlagError{err}
	}
	if fs.NArg() > 0 {
		return nil, &FlagError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	fs.Visit(func(f *flag.Flag) {
		fv.set[f.Name] = true
		if f.Name == "config" {
			p := f.Value.String()
			fv.config = &p
		}
	})
	return fv, nil
}

func (fv *flagValues) apply(c *Config) {
	v := fv.v
	if fv.set["coordinator"] {
		c.Coordinator.URL = v.Coordinator.URL
	}
	c.setToken(v.Coordinator.Token, v.Coordinator.TokenFile)
	if fv.set["ca-file"] {
		c.Coordinator.CAFile = v.Coordinator.CAFile
	}
	if fv.set["insecure-skip-verify"] {
		c.Coordinator.InsecureSkipVerify = v.Coordinator.InsecureSkipVerify
	}
	if fv.set["node"] {
		c.Node.Name = v.Node.Name
	}
	if fv.set["engine"] {
		c.Engines = fv.engines
	}
	if fv.set["probe-concurrency"] {
		c.Probe.Concurrency = v.Probe.Concurrency
	}
	if fv.set["probe-tokens"] {
		c.Probe.Tokens = v.Probe.Tokens
	}
	if fv.set["probe-prompt"] {
		c.Probe.Prompt = v.Probe.Prompt
	}
	if fv.set["log-level"] {
		c.Log.Level = v.Log.Level
	}
	if fv.set["log-json"] {
		c.Log.JSON = v.Log.JSON
	}
	if fv.set["snapshot-interval"] {
		c.SnapshotInterval = v.SnapshotInterval
	}
	if fv.set["poll-interval"] {
		c.PollInterval = v.PollInterval
	}
}
