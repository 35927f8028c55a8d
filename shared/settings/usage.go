package settings

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"heft/shared/version"
)

// Exit codes shared by every heft binary.
const (
	// ExitUsage: a bad command line (unknown flag, bad flag value, stray
	// argument). The usage follows the error on stderr.
	ExitUsage = 2
	// ExitConfig is sysexits' EX_CONFIG: the configuration file, the
	// environment or a secret it names is wrong. Restarting will not help,
	// so a service unit may list it in RestartPreventExitStatus.
	ExitConfig = 78
)

// Describe writes every setting as key=value in table order, with secrets
// redacted: what a Config's String method returns.
func (c Command) Describe() string {
	parts := make([]string, len(c.Settings))
	for i, s := range c.Settings {
		parts[i] = s.Key + "=" + quoteEmpty(shown(s, s.v.String()))
	}
	return strings.Join(parts, " ")
}

// Usage writes the command's help: synopsis, about and PrintFlags.
func (c Command) Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", c.Synopsis)
	if c.About != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(c.About, "\n"))
	}
	fmt.Fprintln(w, "\nflags (each flag beats its environment variable, which beats the file):")
	c.PrintFlags(w)
}

// PrintFlags writes the flag list of Usage: each flag with its
// environment variable and default, then the variables without a flag.
func (c Command) PrintFlags(w io.Writer) {
	rows := [][2]string{{"--config FILE", "TOML configuration file (" + c.ConfigEnv() + ")"}}
	var envOnly []string
	for _, s := range c.Settings {
		env := c.envOf(s)
		name := c.flagOf(s)
		if name == "" {
			if env != "" {
				envOnly = append(envOnly, env)
			}
			continue
		}
		left := "--" + name
		if s.v.kind() != kindBool {
			left += " " + s.meta
		}
		var notes []string
		if env != "" {
			notes = append(notes, env)
		}
		if d := s.v.String(); d != "" && d != "false" && !s.secret && s.v.kind() != kindList {
			notes = append(notes, "default "+d)
		}
		text := s.Usage
		if len(notes) > 0 {
			text += " (" + strings.Join(notes, "; ") + ")"
		}
		rows = append(rows, [2]string{left, text})
	}
	if c.Version {
		rows = append(rows, [2]string{"--version", "print the version and exit"})
	}
	rows = append(rows, [2]string{"-h, --help", "print this help and exit"})
	writeRows(w, rows)
	if len(envOnly) > 0 {
		fmt.Fprintf(w, "\nfrom the file or the environment only (secrets stay off the command line): %s\n", strings.Join(envOnly, ", "))
	}
}

// writeRows aligns a two-column flag list; a long left column puts its
// text on the next line.
func writeRows(w io.Writer, rows [][2]string) {
	const most = 34
	width := 0
	for _, r := range rows {
		if n := len(r[0]); n > width && n <= most {
			width = n
		}
	}
	for _, r := range rows {
		if len(r[0]) > width {
			fmt.Fprintf(w, "  %s\n  %-*s  %s\n", r[0], width, "", r[1])
			continue
		}
		fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], r[1])
	}
}

// PrintFlags writes the flags of fs in the style of every heft command's
// help: --name VALUE, then the text and its default.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	var rows [][2]string
	fs.VisitAll(func(f *flag.Flag) {
		meta, text := flag.UnquoteUsage(f)
		left := "--" + f.Name
		switch meta {
		case "":
		case "int", "uint", "float":
			left += " N"
		case "string":
			left += " TEXT"
		default:
			left += " " + strings.ToUpper(meta)
		}
		d := f.DefValue
		if dur, err := time.ParseDuration(d); err == nil && meta == "duration" {
			d = FormatDuration(dur)
		}
		if d != "" && d != "0" && d != "false" && d != "[]" {
			text += " (default " + d + ")"
		}
		rows = append(rows, [2]string{left, text})
	})
	rows = append(rows, [2]string{"-h, --help", "print this help and exit"})
	writeRows(w, rows)
}

// ParseFlags parses args into fs, a command's plain flags, and handles
// what every heft command handles the same way. It returns ok when the
// command should go on; otherwise code is the exit code:
//   - -h or --help: usage on stdout, 0;
//   - --version, when fs defines it: "<binary> <version>" on stdout, 0;
//   - a bad flag or a stray argument: the error and usage on stderr, 2.
func ParseFlags(fs *flag.FlagSet, args []string, usage func(io.Writer), stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if err != nil {
		err = flagError(err)
	}
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err == nil {
		if v := fs.Lookup("version"); v != nil && v.Value.String() == "true" {
			err = ErrVersion
		}
	}
	if err == nil {
		return 0, true
	}
	return Exit(fs.Name(), &UsageError{err}, usage, stdout, stderr), false
}

// Exit reports err, a command's failure to load its configuration, and
// returns the exit code, the same way for every heft command:
//   - -h or --help: usage on stdout, 0;
//   - --version: "<binary> <version>" on stdout, 0;
//   - a *UsageError: the error, then usage, on stderr, ExitUsage;
//   - anything else, a bad configuration: each problem on its own line on
//     stderr, ExitConfig.
func Exit(name string, err error, usage func(io.Writer), stdout, stderr io.Writer) int {
	var ue *UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		usage(stdout)
		return 0
	case errors.Is(err, ErrVersion):
		fmt.Fprintf(stdout, "%s %s\n", strings.Fields(name)[0], version.Version)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\n\n", name, err)
		usage(stderr)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: the configuration has problems:\n", name)
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if strings.TrimSpace(line) != "" {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
	}
	return ExitConfig
}
