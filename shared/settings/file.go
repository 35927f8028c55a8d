package settings

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

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
		if s.flagOnly {
			continue
		}
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
			// table without a word, so ask first. A table made by dotted
			// keys (thresholds.pool_hold = 0.4) has no type of its own.
			if t := md.Type(parts[:i+1]...); t != "Hash" && t != "" {
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
		if s.flagOnly {
			continue
		}
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
