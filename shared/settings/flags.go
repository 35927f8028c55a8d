package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

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
