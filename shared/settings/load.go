package settings

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Command describes a command that reads a configuration: its name, the
// settings it has and how their names derive.
type Command struct {
	// Name is the command as typed: "heft-coordinator", "heft-agent run".
	Name string
	// Synopsis follows "usage: " in help; About is the paragraph after it.
	Synopsis, About string
	// EnvPrefix starts every derived environment variable: "HEFT_",
	// "HEFT_COORDINATOR_". PREFIX+"CONFIG" names the file when --config
	// does not.
	EnvPrefix string
	// Settings are the rows, in the order help and reports list them.
	Settings []Setting
	// Alternatives are groups of keys that say one thing two ways (a token
	// or a token file): a layer that sets one of a group clears the others
	// from the layers below, so a token file in the environment replaces a
	// token in the file. Both set in one layer stay set, for Validate to
	// refuse.
	Alternatives [][]string
	// Version adds --version, which prints "<binary> <version>".
	Version bool
}

// ErrVersion is what Load returns, wrapped in a *UsageError, for --version.
var ErrVersion = errors.New("version requested")

// UsageError is a mistake on the command line, as opposed to a bad file
// or environment: exit 2 with the usage. It wraps flag.ErrHelp for -h and
// ErrVersion for --version.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// ConfigEnv is the environment variable that names the configuration file.
func (c Command) ConfigEnv() string { return c.EnvPrefix + "CONFIG" }

// flagOf and envOf are a setting's names, "" when it has none.
func (c Command) flagOf(s Setting) string {
	switch s.flag {
	case "-":
		return ""
	case "":
		return FlagName(s.Key)
	}
	return s.flag
}

func (c Command) envOf(s Setting) string {
	switch s.env {
	case "-":
		return ""
	case "":
		return EnvName(c.EnvPrefix, s.Key)
	}
	return s.env
}

// EnvVars lists the environment variables the command reads.
func (c Command) EnvVars() []string {
	vars := []string{c.ConfigEnv()}
	for _, s := range c.Settings {
		if e := c.envOf(s); e != "" {
			vars = append(vars, e)
		}
	}
	return vars
}

// Load applies the layers over the values the settings are bound to
// (their defaults): the TOML file at path (or the one --config names, or
// PREFIX+CONFIG when path is ""), the environment (env is os.Getenv in
// production), then the flags in args. It returns a Report of where each
// value came from. Command-line mistakes are *UsageError; every problem of
// the file or the environment is returned at once.
func (c Command) Load(path string, args []string, env func(string) string) (*Report, error) {
	if env == nil {
		env = func(string) string { return "" }
	}
	rep := c.newReport()
	flags, err := c.parseFlags(args)
	if err != nil {
		return nil, err
	}
	switch {
	case flags.config != "":
		path = flags.config
	case path == "":
		path = env(c.ConfigEnv())
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		if err := c.decode(string(data), rep, path); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
		rep.Path = path
	}
	if err := c.applyEnv(env, rep); err != nil {
		return nil, err
	}
	c.applyFlags(flags, rep)
	return rep, nil
}

// Parse applies TOML text over the values the settings are bound to,
// without a file, the environment or flags: for tests and tools.
func (c Command) Parse(text string) error {
	return c.decode(text, c.newReport(), "")
}

func (c Command) newReport() *Report {
	rep := &Report{rows: make([]reportRow, len(c.Settings))}
	for i, s := range c.Settings {
		rep.rows[i] = reportRow{key: s.Key, secret: s.secret,
			origins: []Origin{{Source: FromDefault, Value: shown(s, s.v.String())}}}
	}
	return rep
}

// layer is one source's changes, applied together so that alternatives
// can be resolved.
type layer struct {
	source Source
	set    []bool   // by row
	names  []string // by row: the file, variable or flag
}

func (c Command) newLayer(src Source) *layer {
	return &layer{source: src, set: make([]bool, len(c.Settings)), names: make([]string, len(c.Settings))}
}

// finish clears the alternatives replaced in this layer and records the
// layer in the report.
func (c Command) finish(l *layer, rep *Report) {
	for _, group := range c.Alternatives {
		var setBy string
		for i, s := range c.Settings {
			if l.set[i] && slices.Contains(group, s.Key) {
				setBy = l.names[i]
			}
		}
		if setBy == "" {
			continue
		}
		for i, s := range c.Settings {
			if !l.set[i] && slices.Contains(group, s.Key) && rep.rows[i].isSet() {
				s.v.reset()
				rep.rows[i].origins = append(rep.rows[i].origins, Origin{Source: l.source, Name: setBy, Cleared: true})
			}
		}
	}
	for i, s := range c.Settings {
		if l.set[i] {
			rep.rows[i].origins = append(rep.rows[i].origins, Origin{Source: l.source, Name: l.names[i], Value: shown(s, s.v.String())})
		}
	}
}

func (c Command) applyEnv(env func(string) string, rep *Report) error {
	l := c.newLayer(FromEnv)
	var errs []error
	for i, s := range c.Settings {
		name := c.envOf(s)
		if name == "" {
			continue
		}
		text := env(name)
		if strings.TrimSpace(text) == "" {
			continue
		}
		if err := c.applyText(s, name, text); err != nil {
			errs = append(errs, err)
			continue
		}
		l.set[i], l.names[i] = true, name
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.finish(l, rep)
	return nil
}

// applyText applies an environment variable: a list's entries are
// separated by ';'.
func (c Command) applyText(s Setting, name, text string) error {
	if s.v.kind() != kindList {
		apply, err := s.v.parse(text)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		apply()
		return nil
	}
	var applies []func()
	for entry := range strings.SplitSeq(text, ";") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		apply, err := s.v.parse(entry)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		applies = append(applies, apply)
	}
	s.v.reset()
	for _, a := range applies {
		a()
	}
	return nil
}
