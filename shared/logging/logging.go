// Package logging builds the root logger of every heft binary, so that
// --log-level and --log-json mean the same everywhere.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/mattn/go-isatty"
)

// DefaultLevel is the level of a binary whose configuration names none.
const DefaultLevel = "info"

// Levels are the names --log-level accepts, quietest last.
var Levels = []string{"trace", "debug", "info", "warn", "error"}

// New returns the root logger of a binary called name, writing to w at
// level. It writes JSON lines when json is set or w is not a terminal
// (journald, a file, a pipe), human-readable lines on a terminal.
// An unknown level is read as info; CheckLevel refuses it first.
func New(name, level string, json bool, w io.Writer) hclog.Logger {
	lvl := hclog.LevelFromString(level)
	if lvl == hclog.NoLevel {
		lvl = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       name,
		Level:      lvl,
		Output:     w,
		JSONFormat: json || !IsTerminal(w),
	})
}

// CheckLevel returns an error naming the accepted levels when level is
// not one of them.
func CheckLevel(level string) error {
	if hclog.LevelFromString(level) == hclog.NoLevel {
		return fmt.Errorf("log level %q is not one of %s", level, strings.Join(Levels, ", "))
	}
	return nil
}

// IsTerminal reports whether w is a terminal, for human-readable logs and
// live progress lines.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
