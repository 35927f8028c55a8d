package settings

import (
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// ListOf says how to read the entries of a List.
type ListOf[T any] struct {
	// Fields are the keys of one entry's table, bound to e.
	Fields func(e *T) []Setting
	// Parse reads one entry from a flag or the environment. Nil reads
	// key=value pairs separated by commas, one per field:
	// --haproxy model=m,socket=/run/haproxy.sock.
	Parse func(text string) (T, error)
	// New returns an entry before its table is read; nil: the zero T.
	New func() T
}

// List is an array of tables: [[engine]] in the file, a repeatable flag
// (--engine ...), and one environment variable holding the entries
// separated by ';'. A layer that gives any entry replaces the whole list
// of the layers below.
func List[T any](key string, p *[]T, usage string, of ListOf[T]) Setting {
	return Setting{Key: key, Usage: usage, meta: "KEY=VALUE,...", v: &list[T]{key: key, p: p, of: of}}
}

type list[T any] struct {
	key string
	p   *[]T
	of  ListOf[T]
}

func (l *list[T]) kind() kind { return kindList }
func (l *list[T]) reset()     { *l.p = nil }

func (l *list[T]) newEntry() T {
	if l.of.New != nil {
		return l.of.New()
	}
	var zero T
	return zero
}

func (l *list[T]) parse(text string) (func(), error) {
	var e T
	var err error
	if l.of.Parse != nil {
		e, err = l.of.Parse(text)
	} else {
		e, err = l.parsePairs(text)
	}
	if err != nil {
		return nil, err
	}
	return func() { *l.p = append(*l.p, e) }, nil
}

// parsePairs reads key=value,key=value through the entry's fields.
func (l *list[T]) parsePairs(text string) (T, error) {
	e := l.newEntry()
	fields := l.of.Fields(&e)
	for pair := range strings.SplitSeq(strings.TrimSpace(text), ",") {
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		// The entry itself is not quoted: one of its fields may be a secret.
		if !ok {
			return e, fmt.Errorf("%s: an entry holds %q, which is not key=value", l.key, k)
		}
		f, found := findKey(fields, k)
		if !found {
			return e, fmt.Errorf("%s: unknown key %q (want %s)", l.key, k, strings.Join(keysOf(fields), ", "))
		}
		apply, err := f.v.parse(strings.TrimSpace(v))
		if err != nil {
			return e, fmt.Errorf("%s: %s: %w", l.key, k, err)
		}
		apply()
	}
	return e, nil
}

func findKey(rows []Setting, key string) (Setting, bool) {
	for _, r := range rows {
		if r.Key == key {
			return r, true
		}
	}
	return Setting{}, false
}

func keysOf(rows []Setting) []string {
	keys := make([]string, len(rows))
	for i, r := range rows {
		keys[i] = r.Key
	}
	return keys
}

// fieldKeys are the keys one entry's table may hold.
func (l *list[T]) fieldKeys() []string {
	var e T
	return keysOf(l.of.Fields(&e))
}

func (l *list[T]) decode(md *toml.MetaData, key string, p toml.Primitive) error {
	// The decoder silently skips an entry that is not a table, so look first.
	var raw []any
	if err := md.PrimitiveDecode(p, &raw); err != nil {
		return err
	}
	for i, r := range raw {
		if _, ok := r.(map[string]any); !ok {
			return fmt.Errorf("%s %d: want a table (%s = [{...}] or [[%s]]), got %v", key, i+1, key, key, r)
		}
	}
	var tables []map[string]toml.Primitive
	if err := md.PrimitiveDecode(p, &tables); err != nil {
		return err
	}
	entries := make([]T, 0, len(tables))
	var errs []error
	for i, table := range tables {
		e := l.newEntry()
		for _, f := range l.of.Fields(&e) {
			fp, ok := table[f.Key]
			if !ok {
				continue
			}
			if err := f.v.decode(md, key+"."+f.Key, fp); err != nil {
				errs = append(errs, fmt.Errorf("%s %d: %w", key, i+1, err))
			}
		}
		entries = append(entries, e)
	}
	*l.p = entries
	return errors.Join(errs...)
}

// String writes the entries as the environment variable takes them when
// Parse is nil: the key=value pairs that differ from a new entry's,
// entries separated by "; ". Secret fields are redacted.
func (l *list[T]) String() string {
	def := l.newEntry()
	defaults := l.of.Fields(&def)
	parts := make([]string, 0, len(*l.p))
	for i := range *l.p {
		var pairs []string
		for j, f := range l.of.Fields(&(*l.p)[i]) {
			if v := f.v.String(); v != defaults[j].v.String() {
				pairs = append(pairs, f.Key+"="+shown(f, v))
			}
		}
		parts = append(parts, strings.Join(pairs, ","))
	}
	return strings.Join(parts, "; ")
}
