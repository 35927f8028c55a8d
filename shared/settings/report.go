package settings

import (
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// Source is a layer of the configuration.
type Source int

const (
	FromDefault Source = iota
	FromFile
	FromEnv
	FromFlag
)

func (s Source) String() string {
	return [...]string{"default", "file", "env", "flag"}[s]
}

// Origin is what one layer did to a setting.
type Origin struct {
	Source Source
	// Name is the file's path, the environment variable or the flag
	// ("--state-dir"); "" for a default.
	Name string
	// Value is the value the layer set, [redacted] for a secret.
	Value string
	// Cleared: the layer set another way of saying the same thing (a
	// token file instead of a token), which replaced this one; Name is
	// where that other value came from.
	Cleared bool
}

func (o Origin) String() string {
	where := o.Source.String()
	if o.Name != "" {
		where += " " + o.Name
	}
	if o.Cleared {
		return "cleared by " + where
	}
	return where
}

// Report says where each setting's value came from.
type Report struct {
	// Path is the configuration file read, "" for none.
	Path string
	rows []reportRow
}

type reportRow struct {
	key     string
	secret  bool
	origins []Origin // the default first, then each layer that set it
}

func (r reportRow) last() Origin { return r.origins[len(r.origins)-1] }

// isSet: a layer gave the setting a value that still stands.
func (r reportRow) isSet() bool {
	o := r.last()
	return o.Source != FromDefault && !o.Cleared
}

const redacted = "[redacted]"

func shown(s Setting, v string) string {
	if s.secret && v != "" {
		return redacted
	}
	return v
}

// Entry is a setting that did not keep its default.
type Entry struct {
	Key string
	// Origin is the layer the value finally came from.
	Origin Origin
	// Over is the value it replaced from a lower layer other than the
	// defaults, when that value differed: a flag over the file, say.
	Over *Origin
}

// Entries lists, in table order, every setting a file, the environment or
// a flag set (or cleared).
func (r *Report) Entries() []Entry {
	if r == nil {
		return nil
	}
	var out []Entry
	for _, row := range r.rows {
		if len(row.origins) == 1 {
			continue
		}
		e := Entry{Key: row.key, Origin: row.last()}
		for i := len(row.origins) - 2; i >= 1; i-- {
			if o := row.origins[i]; !o.Cleared && (o.Value != e.Origin.Value || e.Origin.Cleared) {
				e.Over = &o
				break
			}
		}
		out = append(out, e)
	}
	return out
}

// Origin returns where key's value came from.
func (r *Report) Origin(key string) (Origin, bool) {
	if r == nil {
		return Origin{}, false
	}
	for _, row := range r.rows {
		if row.key == key {
			return row.last(), true
		}
	}
	return Origin{}, false
}

// Log writes the start-up lines: one info line with every setting that
// did not keep its default and where it came from, and a warning for each
// value that replaced a different one from a lower layer (a flag over the
// file), so that no layer silently overrides another.
func (r *Report) Log(logger hclog.Logger) {
	if r == nil {
		return
	}
	file := r.Path
	if file == "" {
		file = "none"
	}
	args := []any{"file", file}
	entries := r.Entries()
	for _, e := range entries {
		if e.Origin.Cleared {
			continue
		}
		args = append(args, e.Key, fmt.Sprintf("%s (%s)", quoteEmpty(e.Origin.Value), e.Origin))
	}
	logger.Info("settings: every value not at its default, and where it came from", args...)
	for _, e := range entries {
		if e.Over == nil {
			continue
		}
		if e.Origin.Cleared {
			logger.Warn("setting replaced", "key", e.Key, "by", strings.TrimPrefix(e.Origin.String(), "cleared by "),
				"replaced", fmt.Sprintf("%s (%s)", quoteEmpty(e.Over.Value), e.Over))
			continue
		}
		logger.Warn("setting overridden", "key", e.Key, "value", quoteEmpty(e.Origin.Value), "from", e.Origin.String(),
			"overrides", fmt.Sprintf("%s (%s)", quoteEmpty(e.Over.Value), e.Over))
	}
}

func quoteEmpty(v string) string {
	if v == "" {
		return `""`
	}
	return v
}
