package sim

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// The real engines are Python programs: their logs print Python reprs and
// their metrics print floats the way prometheus_client does. These helpers
// reproduce both so the agent's parsers meet the real shapes.

// pyArg is one key of an ordered Python dict or dataclass repr.
type pyArg struct {
	key string
	val any
}

// pyDict renders args as a Python dict repr: {'a': 1, 'b': 'x'}.
func pyDict(args []pyArg) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = pyStr(a.key) + ": " + pyRepr(a.val)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// pyDataclass renders args as a dataclass repr: Name(a=1, b='x').
func pyDataclass(name string, args []pyArg) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = a.key + "=" + pyRepr(a.val)
	}
	return name + "(" + strings.Join(parts, ", ") + ")"
}

func pyRepr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case string:
		return pyStr(x)
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	case []int64:
		parts := make([]string, len(x))
		for i, n := range x {
			parts[i] = strconv.FormatInt(n, 10)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case []string:
		parts := make([]string, len(x))
		for i, s := range x {
			parts[i] = pyStr(s)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	return pyStr(fmt.Sprint(v))
}

// pyStr quotes like Python's repr: single quotes unless the text holds a
// single quote and no double quote.
func pyStr(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyFloat is Python's repr of a float: 60.0, 0.5, 1e-05, 1e+16.
func pyFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "nan"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	case v == 0:
		return "0.0"
	}
	if a := math.Abs(v); a >= 1e-4 && a < 1e16 {
		s := strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	return strconv.FormatFloat(v, 'e', -1, 64) // 1e-05, 1e+16: as Python prints them
}

// promFloat is prometheus_client's floatToGoString: Python's repr, but
// switching to an exponent once there are more than 6 integer digits.
func promFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	s := pyFloat(v)
	if dot := strings.IndexByte(s, '.'); v > 0 && dot > 6 && !strings.ContainsAny(s, "e") {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return fmt.Sprintf("%se+0%d", mantissa, dot-1)
	}
	return s
}

// promLabel is one label of an exposition sample.
type promLabel struct{ name, value string }

// promText writes the Prometheus text exposition format.
type promText struct {
	b      strings.Builder
	format func(float64) string
}

func (p *promText) family(name, help, typ string) {
	fmt.Fprintf(&p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *promText) sample(name string, labels []promLabel, v float64) {
	p.b.WriteString(name)
	if len(labels) > 0 {
		sort.Slice(labels, func(i, j int) bool { return labels[i].name < labels[j].name })
		p.b.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				p.b.WriteByte(',')
			}
			r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
			fmt.Fprintf(&p.b, `%s="%s"`, l.name, r.Replace(l.value))
		}
		p.b.WriteByte('}')
	}
	p.b.WriteByte(' ')
	p.b.WriteString(p.format(v))
	p.b.WriteByte('\n')
}
