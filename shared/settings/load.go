package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
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

// decode reads TOML text into the settings: every value and unknown key
// is checked, and all problems are returned together.
func (c Command) decode(text string, rep *Report, path string) error {
	var top map[string]toml.Primitive
	md, err := toml.Decode(text, &top)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return errors.New(pe.ErrorWithPosition())
		}
		return err
	}
	l := c.newLayer(FromFile)
	var errs []error
	tables := map[string]map[string]toml.Primitive{"": top}
	for i, s := range c.Settings {
		p, ok, err := c.lookup(&md, tables, s.Key)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		if s.v.kind() == kindList && md.Type(strings.Split(s.Key, ".")...) == "Hash" {
			errs = append(errs, fmt.Errorf("[%s] is one table: write each %s as an [[%s]] table, with double brackets", s.Key, s.Key, s.Key))
			continue
		}
		if err := s.v.decode(&md, s.Key, p); err != nil {
			errs = append(errs, err)
			continue
		}
		l.set[i], l.names[i] = true, path
	}
	if unknown := c.unknownKeys(md); len(unknown) > 0 {
		errs = append(errs, fmt.Errorf("unknown keys: %s", strings.Join(unknown, ", ")))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.finish(l, rep)
	return nil
}

// lookup finds a dotted key's value, decoding (and caching) the tables on
// its way.
func (c Command) lookup(md *toml.MetaData, tables map[string]map[string]toml.Primitive, key string) (toml.Primitive, bool, error) {
	parts := strings.Split(key, ".")
	table := tables[""]
	for i := range len(parts) - 1 {
		name := strings.Join(parts[:i+1], ".")
		sub, seen := tables[name]
		if !seen {
			p, ok := table[parts[i]]
			if !ok {
				return toml.Primitive{}, false, nil
			}
			// The decoder turns a value that is not a table into an empty
			// table without a word, so ask first.
			if t := md.Type(parts[:i+1]...); t != "Hash" {
				return toml.Primitive{}, false, fmt.Errorf("%s must be a table ([%s]), not a %s", name, name, strings.ToLower(t))
			}
			sub = map[string]toml.Primitive{}
			if err := md.PrimitiveDecode(p, &sub); err != nil {
				return toml.Primitive{}, false, err
			}
			tables[name] = sub
		}
		table = sub
	}
	p, ok := table[parts[len(parts)-1]]
	return p, ok, nil
}

// unknownKeys lists, in file order, the keys no setting reads.
func (c Command) unknownKeys(md toml.MetaData) []string {
	known := map[string]bool{}
	for _, s := range c.Settings {
		parts := strings.Split(s.Key, ".")
		for i := range parts {
			known[strings.Join(parts[:i+1], ".")] = true // the key and its tables
		}
		if l, ok := s.v.(interface{ fieldKeys() []string }); ok {
			for _, k := range l.fieldKeys() {
				known[s.Key+"."+k] = true
			}
		}
	}
	var unknown []string
	for _, k := range md.Keys() {
		name := k.String()
		if !known[name] && !slices.Contains(unknown, name) && !underUnknown(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

// underUnknown: the keys of an unknown table are not listed one by one.
func underUnknown(unknown []string, name string) bool {
	for _, u := range unknown {
		if strings.HasPrefix(name, u+".") {
			return true
		}
	}
	return false
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

// flagValues holds a command line, parsed and checked, to be applied after
// the environment.
type flagValues struct {
	config  string
	applies [][]func() // by row, in command-line order
	err     error      // the first bad value, in the words of its setting
}

// flagText checks a flag's text when it is parsed, so that a bad value is
// a usage error, and keeps it for later.
type flagText struct {
	s       Setting
	name    string
	applies *[]func()
	err     *error
}

func (f *flagText) String() string { return "" }
func (f *flagText) Set(text string) error {
	apply, err := f.s.v.parse(text)
	if err != nil {
		if *f.err == nil {
			*f.err = fmt.Errorf("--%s: %w", f.name, err)
		}
		return err
	}
	*f.applies = append(*f.applies, apply)
	return nil
}

type boolFlagText struct{ flagText }

func (*boolFlagText) IsBoolFlag() bool { return true }

func (c Command) parseFlags(args []string) (*flagValues, error) {
	fv := &flagValues{applies: make([][]func(), len(c.Settings))}
	fs := flag.NewFlagSet(c.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&fv.config, "config", "", "")
	version := new(bool)
	if c.Version {
		fs.BoolVar(version, "version", false, "")
	}
	for i, s := range c.Settings {
		name := c.flagOf(s)
		if name == "" {
			continue
		}
		ft := flagText{s: s, name: name, applies: &fv.applies[i], err: &fv.err}
		if s.v.kind() == kindBool {
			fs.Var(&boolFlagText{ft}, name, s.Usage)
		} else {
			fs.Var(&ft, name, s.Usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		if fv.err != nil {
			err = fv.err
		}
		return nil, &UsageError{flagError(err)}
	}
	if fs.NArg() > 0 {
		return nil, &UsageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if *version {
		return nil, &UsageError{ErrVersion}
	}
	return fv, nil
}

func (c Command) applyFlags(fv *flagValues, rep *Report) {
	l := c.newLayer(FromFlag)
	for i, s := range c.Settings {
		if len(fv.applies[i]) == 0 {
			continue
		}
		if s.v.kind() == kindList {
			s.v.reset()
		}
		for _, apply := range fv.applies[i] {
			apply()
		}
		l.set[i], l.names[i] = true, "--"+c.flagOf(s)
	}
	c.finish(l, rep)
}

// flagError words the flag package's errors in the double-dash style of
// heft's help: "unknown flag: --nope" rather than "flag provided but not
// defined: -nope".
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := strings.NewReplacer(
		"flag provided but not defined: -", "unknown flag: --",
		"flag needs an argument: -", "flag needs an argument: --",
		" for flag -", " for flag --",
		" for -", " for --",
	).Replace(err.Error())
	return errors.New(msg)
}
