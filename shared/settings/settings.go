// Package settings is the one configuration mechanism of heft's binaries.
// A binary describes its configuration as a table: one Setting per key,
// bound to a field of its Config. From that one row come the TOML key, the
// environment variable and the flag, the help text, the start-up lines that
// say where each value came from, and the redaction of secrets.
//
// Load applies the layers in order, each overriding the one before:
// defaults (the values the fields hold), the TOML file, HEFT_* environment
// variables, flags. Keys the table does not know are refused. A duration
// is a string with a unit everywhere ("30s"): a bare number is refused
// with a message saying what to write. The binary validates the result.
package settings

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// A Setting is one row of a binary's configuration: a key and the field
// its value goes into. Build one with String, Bool, Int, Uint64, Float,
// Duration or List, then adjust it with Flag, Env, Meta and Secret.
type Setting struct {
	// Key is the TOML key, dotted inside a table ("coordinator.url"); for
	// a List, the name of its array of tables ("engine" for [[engine]]).
	Key   string
	Usage string

	flag     string // "" derives it from Key; "-" means none
	env      string // "" derives it from Key and the prefix; "-" means none
	meta     string // the value's name in help: FILE, URL, ...
	secret   bool
	flagOnly bool
	v        value
}

// Flag names the setting's flag (without dashes), instead of the one
// derived from its key; "-" gives it none.
func (s Setting) Flag(name string) Setting { s.flag = name; return s }

// Env names the setting's environment variable, instead of the one
// derived from its key; "-" gives it none.
func (s Setting) Env(name string) Setting { s.env = name; return s }

// Meta names the value in help text: "--token-file FILE".
func (s Setting) Meta(name string) Setting { s.meta = name; return s }

// FlagOnly makes a setting a command-line switch only, not a key of the
// file nor an environment variable: heft-sync's --check.
func (s Setting) FlagOnly() Setting { s.flagOnly, s.env = true, "-"; return s }

// Secret marks a value that is never printed: help text shows no default,
// reports and String show [redacted]. A secret still has a flag unless
// Flag("-") takes it away (a command line is visible to every user).
func (s Setting) Secret() Setting { s.secret = true; return s }

// FlagName derives a flag from a key: "thresholds.pool_hold" → "thresholds-pool-hold".
func FlagName(key string) string {
	return strings.NewReplacer(".", "-", "_", "-").Replace(key)
}

// EnvName derives an environment variable from a key and a prefix:
// ("HEFT_", "probe.concurrency") → "HEFT_PROBE_CONCURRENCY".
func EnvName(prefix, key string) string {
	return prefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// value is what a Setting reads and writes.
type value interface {
	// parse reads text from the environment or a flag and returns how to
	// apply it; a list's apply appends one entry.
	parse(text string) (apply func(), err error)
	// decode reads the TOML file's value.
	decode(md *toml.MetaData, key string, p toml.Primitive) error
	// String is the current value as a flag would take it.
	String() string
	// reset sets the zero value: an alternative replaced by another, or a
	// list about to be replaced by a higher layer.
	reset()
	kind() kind
}

type kind int

const (
	kindScalar kind = iota
	kindBool
	kindList
)

// scalar is a value of one field of type T.
type scalar[T any] struct {
	p        *T
	read     func(string) (T, error)
	format   func(T) string
	decodeFn func(md *toml.MetaData, key string, p toml.Primitive, dst *T) error
	k        kind
}

func (s *scalar[T]) parse(text string) (func(), error) {
	v, err := s.read(text)
	if err != nil {
		return nil, err
	}
	return func() { *s.p = v }, nil
}

func (s *scalar[T]) decode(md *toml.MetaData, key string, p toml.Primitive) error {
	if s.decodeFn != nil {
		return s.decodeFn(md, key, p, s.p)
	}
	return md.PrimitiveDecode(p, s.p)
}

func (s *scalar[T]) String() string { return s.format(*s.p) }
func (s *scalar[T]) reset()         { var zero T; *s.p = zero }
func (s *scalar[T]) kind() kind     { return s.k }

// String is a text setting.
func String(key string, p *string, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "TEXT", v: &scalar[string]{p: p,
		read:   func(s string) (string, error) { return s, nil },
		format: func(s string) string { return s }}}
}

// Bool is a switch: --name alone sets it; true/false, 1/0 are accepted.
func Bool(key string, p *bool, usage string) Setting {
	return Setting{Key: key, Usage: usage, v: &scalar[bool]{p: p, k: kindBool,
		read: func(s string) (bool, error) {
			b, err := strconv.ParseBool(strings.TrimSpace(s))
			if err != nil {
				return false, fmt.Errorf("%q is not true or false", s)
			}
			return b, nil
		},
		format: strconv.FormatBool}}
}

// Int is a whole number, into an int or an int64 field.
func Int[T int | int64](key string, p *T, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "N", v: &scalar[T]{p: p,
		read: func(s string) (T, error) {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil || int64(T(n)) != n {
				return 0, fmt.Errorf("%q is not a whole number", s)
			}
			return T(n), nil
		},
		format: func(n T) string { return strconv.FormatInt(int64(n), 10) }}}
}

// Uint64 is a whole number that cannot be negative, such as a byte count.
func Uint64(key string, p *uint64, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "N", v: &scalar[uint64]{p: p,
		read: func(s string) (uint64, error) {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%q is not a whole number of at least 0", s)
			}
			return n, nil
		},
		format: func(n uint64) string { return strconv.FormatUint(n, 10) },
		// The TOML decoder would wrap a negative number around to a huge one.
		decodeFn: func(md *toml.MetaData, key string, p toml.Primitive, dst *uint64) error {
			var n int64
			if err := md.PrimitiveDecode(p, &n); err != nil {
				return err
			}
			if n < 0 {
				return fmt.Errorf("%s = %d: must be at least 0", key, n)
			}
			*dst = uint64(n)
			return nil
		}}}
}

// Strings is a list of words: a TOML array of strings; on the command
// line or in the environment, words separated by commas. An empty array
// in the file ([]) stays empty, not absent.
func Strings(key string, p *[]string, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "A,B,...", v: &scalar[[]string]{p: p,
		read: func(s string) ([]string, error) {
			var words []string
			for w := range strings.SplitSeq(s, ",") {
				words = append(words, strings.TrimSpace(w))
			}
			return words, nil
		},
		format: func(words []string) string { return strings.Join(words, ",") }}}
}

// Float is a number.
func Float(key string, p *float64, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "N", v: &scalar[float64]{p: p,
		read: func(s string) (float64, error) {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil {
				return 0, fmt.Errorf("%q is not a number", s)
			}
			return f, nil
		},
		format: func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }}}
}

// Duration is a length of time, written with a unit everywhere: "30s",
// "1h30m". A bare number is refused: the TOML decoder would read
// offline_grace = 30 as 30 nanoseconds.
func Duration(key string, p *time.Duration, usage string) Setting {
	return Setting{Key: key, Usage: usage, meta: "DURATION", v: &scalar[time.Duration]{p: p,
		read:   parseDuration,
		format: FormatDuration,
		decodeFn: func(md *toml.MetaData, key string, p toml.Primitive, dst *time.Duration) error {
			d := durationText{key: key}
			if err := md.PrimitiveDecode(p, &d); err != nil {
				return err
			}
			*dst = d.d
			return nil
		}}}
}

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, numErr := strconv.ParseFloat(s, 64); numErr == nil {
		return 0, fmt.Errorf("%q has no unit: write %ss (or ms, m, h)", s, s)
	}
	return 0, fmt.Errorf("%q is not a duration like 30s, 5m or 1h30m", s)
}

// durationText decodes a TOML duration, which must be a string; the
// decoder adds the line number to its errors.
type durationText struct {
	key string
	d   time.Duration
}

func (t *durationText) UnmarshalTOML(data any) error {
	switch v := data.(type) {
	case string:
		d, err := parseDuration(v)
		if err != nil {
			return fmt.Errorf("%s: %w", t.key, err)
		}
		t.d = d
		return nil
	case int64, float64:
		name := t.key[strings.LastIndex(t.key, ".")+1:]
		return fmt.Errorf("%s = %v is a bare number; a duration needs a unit: write %s = \"%vs\" (or ms, m, h)",
			name, v, name, v)
	default:
		return fmt.Errorf("%s must be a duration like \"30s\", not %T", t.key, data)
	}
}

// FormatDuration writes d as a flag would take it, without the zero
// minutes and seconds time.Duration.String adds: 6h, 1h30m, 30s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
