package enginelog

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Engines print their launch arguments as Python reprs: vLLM a dict
// ({'model': 'Qwen/Qwen3-8B', 'data_parallel_size': 2}), SGLang and old
// vLLM a dataclass or Namespace (ServerArgs(model_path='...', dp_size=2)).
// This file parses the value grammar those reprs use. It is written for
// logs, not Python source: every input ends in a value or an error, never
// a panic, and nesting is bounded.

type pyKind uint8

const (
	pyStr pyKind = iota + 1
	pyInt
	pyFloat
	pyBool
	pyNone
	pyName // a bare or dotted name (inf, torch.bfloat16) or "..."
	pyRaw  // an opaque <...> repr, kept as printed
	pyList
	pyTuple
	pyDict // Items alternate key, value
	pySet
	pyCall // Text is the callee; Args the arguments, keyword or positional
)

// pyValue is one parsed Python literal.
type pyValue struct {
	Kind  pyKind
	Text  string    // decoded string, number as printed, name, callee, raw repr
	Items []pyValue // list, tuple, set elements; dict keys and values
	Args  []pyArg   // call arguments in order
}

// pyArg is one call argument; Key is empty for a positional one.
type pyArg struct {
	Key string
	Val pyValue
}

// pyMaxDepth bounds nesting so hostile input cannot exhaust the stack.
const pyMaxDepth = 64

var errPyDepth = errors.New("nested too deep")

type pyParser struct {
	s     string
	i     int
	depth int
}

// parsePyLiteral parses s as exactly one literal, surrounded by optional
// whitespace.
func parsePyLiteral(s string) (pyValue, error) {
	p := &pyParser{s: s}
	v, err := p.value()
	if err != nil {
		return pyValue{}, err
	}
	p.ws()
	if !p.eof() {
		return pyValue{}, p.errf("unexpected %q after the value", p.s[p.i])
	}
	return v, nil
}

// parsePyDictArgs parses a dict repr that starts s and returns its entries
// in order, keys as plain text. On a malformed or cut-short dict it returns
// the entries parsed so far together with the error.
func parsePyDictArgs(s string) ([]pyArg, error) {
	p := &pyParser{s: s}
	p.ws()
	if !p.eat('{') {
		return nil, p.errf("want '{'")
	}
	var out []pyArg
	err := p.seq('}', func() error {
		k, err := p.value()
		if err != nil {
			return err
		}
		p.ws()
		if !p.eat(':') {
			return p.errf("want ':' after a dict key")
		}
		v, err := p.value()
		if err != nil {
			return err
		}
		out = append(out, pyArg{Key: k.plain(), Val: v})
		return nil
	})
	return out, err
}

// parsePyCallArgs parses a call repr such as ServerArgs(a=1, b='x') that
// starts s. Like parsePyDictArgs it keeps what parsed before an error.
func parsePyCallArgs(s string) (string, []pyArg, error) {
	p := &pyParser{s: s}
	p.ws()
	name, ok := p.name()
	if !ok {
		return "", nil, p.errf("want a name")
	}
	if !p.eat('(') {
		return name, nil, p.errf("want '(' after %s", name)
	}
	var out []pyArg
	err := p.seq(')', func() error {
		a, err := p.arg()
		if err == nil {
			out = append(out, a)
		}
		return err
	})
	return name, out, err
}

func (p *pyParser) eof() bool { return p.i >= len(p.s) }

func (p *pyParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r', '\f', '\v':
			p.i++
		default:
			return
		}
	}
}

func (p *pyParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *pyParser) errf(format string, args ...any) error {
	return fmt.Errorf("python literal at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

// seq parses comma-separated entries up to close; the opening bracket has
// been consumed. A trailing comma is allowed, as in Python.
func (p *pyParser) seq(close byte, entry func() error) error {
	for {
		p.ws()
		if p.eof() {
			return p.errf("unclosed, want %q", close)
		}
		if p.s[p.i] == close {
			p.i++
			return nil
		}
		if err := entry(); err != nil {
			return err
		}
		p.ws()
		if p.eof() {
			return p.errf("unclosed, want %q", close)
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case close:
			p.i++
			return nil
		default:
			return p.errf("want ',' or %q, got %q", close, p.s[p.i])
		}
	}
}

func (p *pyParser) value() (pyValue, error) {
	p.ws()
	if p.eof() {
		return pyValue{}, p.errf("want a value, got the end")
	}
	if p.depth >= pyMaxDepth {
		return pyValue{}, p.errf("%v", errPyDepth)
	}
	p.depth++
	defer func() { p.depth-- }()

	c := p.s[p.i]
	switch {
	case c == '\'' || c == '"':
		return p.str(0)
	case c == '[':
		p.i++
		v := pyValue{Kind: pyList}
		err := p.seq(']', func() error {
			item, err := p.value()
			v.Items = append(v.Items, item)
			return err
		})
		return v, err
	case c == '(':
		return p.tuple()
	case c == '{':
		return p.dictOrSet()
	case c == '<':
		return p.angle()
	case strings.HasPrefix(p.s[p.i:], "..."):
		p.i += 3
		return pyValue{Kind: pyName, Text: "..."}, nil
	case c == '-' || c == '+' || isDigit(c) || (c == '.' && p.i+1 < len(p.s) && isDigit(p.s[p.i+1])):
		return p.number()
	}
	if n := p.strPrefix(); n > 0 {
		return p.str(n)
	}
	start := p.i
	name, ok := p.name()
	if !ok {
		return pyValue{}, p.errf("unexpected %q", c)
	}
	switch name {
	case "True", "False":
		return pyValue{Kind: pyBool, Text: name}, nil
	case "None":
		return pyValue{Kind: pyNone, Text: name}, nil
	}
	if p.i < len(p.s) && p.s[p.i] == '(' {
		p.i++
		v := pyValue{Kind: pyCall, Text: name}
		err := p.seq(')', func() error {
			a, err := p.arg()
			v.Args = append(v.Args, a)
			return err
		})
		return v, err
	}
	return pyValue{Kind: pyName, Text: p.s[start:p.i]}, nil
}

// arg parses one call argument: key=value or a positional value.
func (p *pyParser) arg() (pyArg, error) {
	p.ws()
	save := p.i
	if key, ok := p.ident(); ok {
		p.ws()
		if p.i < len(p.s) && p.s[p.i] == '=' && !strings.HasPrefix(p.s[p.i:], "==") {
			p.i++
			v, err := p.value()
			return pyArg{Key: key, Val: v}, err
		}
	}
	p.i = save
	v, err := p.value()
	return pyArg{Val: v}, err
}

func (p *pyParser) tuple() (pyValue, error) {
	p.i++ // '('
	if p.eat(')') {
		return pyValue{Kind: pyTuple}, nil
	}
	first, err := p.value()
	if err != nil {
		return pyValue{}, err
	}
	if p.eat(')') {
		return first, nil // (x) is x
	}
	if !p.eat(',') {
		return pyValue{}, p.errf("want ',' or ')' in a tuple")
	}
	v := pyValue{Kind: pyTuple, Items: []pyValue{first}}
	err = p.seq(')', func() error {
		item, err := p.value()
		v.Items = append(v.Items, item)
		return err
	})
	return v, err
}

func (p *pyParser) dictOrSet() (pyValue, error) {
	p.i++ // '{'
	if p.eat('}') {
		return pyValue{Kind: pyDict}, nil
	}
	first, err := p.value()
	if err != nil {
		return pyValue{}, err
	}
	isDict := p.eat(':')
	v := pyValue{Kind: pySet, Items: []pyValue{first}}
	if isDict {
		v.Kind = pyDict
		val, err := p.value()
		if err != nil {
			return pyValue{}, err
		}
		v.Items = append(v.Items, val)
	}
	if p.eat('}') {
		return v, nil
	}
	if !p.eat(',') {
		return pyValue{}, p.errf("want ',' or '}'")
	}
	err = p.seq('}', func() error {
		item, err := p.value()
		if err != nil {
			return err
		}
		v.Items = append(v.Items, item)
		if !isDict {
			return nil
		}
		if !p.eat(':') {
			return p.errf("want ':' after a dict key")
		}
		val, err := p.value()
		v.Items = append(v.Items, val)
		return err
	})
	return v, err
}

// angle keeps an opaque repr such as <LoadFormat.AUTO: 'auto'> as printed,
// matching nested brackets and skipping quoted text.
func (p *pyParser) angle() (pyValue, error) {
	start := p.i
	depth := 0
	for p.i < len(p.s) {
		switch c := p.s[p.i]; c {
		case '<':
			depth++
		case '>':
			depth--
			if depth == 0 {
				p.i++
				return pyValue{Kind: pyRaw, Text: p.s[start:p.i]}, nil
			}
		case '\'', '"':
			if _, err := p.str(0); err != nil {
				return pyValue{}, err
			}
			continue
		}
		p.i++
	}
	return pyValue{}, p.errf("unclosed '<' opened at byte %d", start)
}

func (p *pyParser) number() (pyValue, error) {
	start := p.i
	if c := p.s[p.i]; c == '-' || c == '+' {
		p.i++
		// -inf, -nan: a signed name.
		if p.i < len(p.s) && isIdentStart(p.s[p.i]) {
			if _, ok := p.ident(); ok {
				return pyValue{Kind: pyName, Text: p.s[start:p.i]}, nil
			}
		}
	}
scan:
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case isDigit(c) || c == '_' || c == '.' || (c < utf8.RuneSelf && unicode.IsLetter(rune(c))):
			p.i++
		case (c == '+' || c == '-') && p.i > start && (p.s[p.i-1] == 'e' || p.s[p.i-1] == 'E') && !isHexPrefixed(p.s[start:p.i]):
			p.i++ // exponent sign
		default:
			break scan
		}
	}
	text := p.s[start:p.i]
	t := strings.ReplaceAll(strings.TrimLeft(text, "+-"), "_", "")
	if t == "" {
		return pyValue{}, p.errf("want a number, got %q", text)
	}
	if _, err := strconv.ParseInt(t, 0, 64); err == nil || allDigits(t) {
		return pyValue{Kind: pyInt, Text: text}, nil
	}
	if _, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(t, "j"), "J"), 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return pyValue{Kind: pyFloat, Text: text}, nil
	}
	return pyValue{}, p.errf("not a number: %q", text)
}

func isHexPrefixed(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return len(s) > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')
}

// strPrefix returns the length of a string prefix (r, b, u, f, rb, br)
// when a quote follows it, else 0.
func (p *pyParser) strPrefix() int {
	for n := 1; n <= 2 && p.i+n < len(p.s); n++ {
		if !strings.ContainsRune("rRbBuUfF", rune(p.s[p.i+n-1])) {
			return 0
		}
		if q := p.s[p.i+n]; q == '\'' || q == '"' {
			return n
		}
	}
	return 0
}

// str parses a quoted string whose prefix is n bytes long.
func (p *pyParser) str(n int) (pyValue, error) {
	raw := strings.ContainsAny(p.s[p.i:p.i+n], "rR")
	p.i += n
	start := p.i
	q := p.s[p.i]
	triple := strings.HasPrefix(p.s[p.i:], strings.Repeat(string(q), 3))
	if triple {
		p.i += 3
	} else {
		p.i++
	}
	var b strings.Builder
	for {
		if p.eof() {
			return pyValue{}, p.errf("unclosed string opened at byte %d", start)
		}
		c := p.s[p.i]
		switch {
		case c == q && (!triple || strings.HasPrefix(p.s[p.i:], strings.Repeat(string(q), 3))):
			if triple {
				p.i += 3
			} else {
				p.i++
			}
			return pyValue{Kind: pyStr, Text: b.String()}, nil
		case c == '\n' && !triple:
			return pyValue{}, p.errf("newline in a string")
		case c == '\\':
			if raw {
				b.WriteByte('\\')
				p.i++
				if !p.eof() {
					p.rune(&b)
				}
				continue
			}
			if err := p.escape(&b); err != nil {
				return pyValue{}, err
			}
		default:
			p.rune(&b)
		}
	}
}

// rune copies one UTF-8 character; an invalid byte becomes U+FFFD so a
// decoded string is always valid UTF-8.
func (p *pyParser) rune(b *strings.Builder) {
	r, size := utf8.DecodeRuneInString(p.s[p.i:])
	b.WriteRune(r)
	p.i += size
}

var pySimpleEscapes = map[byte]string{
	'\\': "\\", '\'': "'", '"': "\"", 'a': "\a", 'b': "\b", 'f': "\f",
	'n': "\n", 'r': "\r", 't': "\t", 'v': "\v", '\n': "",
}

func (p *pyParser) escape(b *strings.Builder) error {
	p.i++ // the backslash
	if p.eof() {
		return p.errf("backslash at the end")
	}
	c := p.s[p.i]
	if s, ok := pySimpleEscapes[c]; ok {
		b.WriteString(s)
		p.i++
		return nil
	}
	switch {
	case c >= '0' && c <= '7':
		j := p.i
		for j < len(p.s) && j < p.i+3 && p.s[j] >= '0' && p.s[j] <= '7' {
			j++
		}
		v, _ := strconv.ParseUint(p.s[p.i:j], 8, 32)
		b.WriteRune(rune(v))
		p.i = j
		return nil
	case c == 'x' || c == 'u' || c == 'U':
		width := 2
		if c == 'u' {
			width = 4
		} else if c == 'U' {
			width = 8
		}
		if p.i+1+width > len(p.s) {
			return p.errf("truncated \\%c escape", c)
		}
		v, err := strconv.ParseUint(p.s[p.i+1:p.i+1+width], 16, 32)
		if err != nil || v > unicode.MaxRune {
			return p.errf("bad \\%c escape", c)
		}
		b.WriteRune(rune(v))
		p.i += 1 + width
		return nil
	}
	// Python keeps unknown escapes (and \N{...}) as written.
	b.WriteByte('\\')
	p.rune(b)
	return nil
}

// name parses a dotted identifier.
func (p *pyParser) name() (string, bool) {
	start := p.i
	if _, ok := p.ident(); !ok {
		return "", false
	}
	for p.i+1 < len(p.s) && p.s[p.i] == '.' && isIdentStart(p.s[p.i+1]) {
		p.i++
		p.ident()
	}
	return p.s[start:p.i], true
}

func (p *pyParser) ident() (string, bool) {
	start := p.i
	for p.i < len(p.s) {
		r, size := utf8.DecodeRuneInString(p.s[p.i:])
		if r == '_' || unicode.IsLetter(r) || (p.i > start && unicode.IsDigit(r)) {
			p.i += size
			continue
		}
		break
	}
	return p.s[start:p.i], p.i > start
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= utf8.RuneSelf
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// plain is the value as launch-args text: strings unquoted, words and
// numbers as printed, containers as their repr.
func (v pyValue) plain() string {
	switch v.Kind {
	case pyStr, pyInt, pyFloat, pyBool, pyNone, pyName, pyRaw:
		return v.Text
	}
	return v.repr()
}

// repr prints v the way Python would, so that parsing it again gives the
// same repr.
func (v pyValue) repr() string {
	var b strings.Builder
	v.writeRepr(&b)
	return b.String()
}

func (v pyValue) writeRepr(b *strings.Builder) {
	switch v.Kind {
	case pyStr:
		writeQuoted(b, v.Text)
	case pyList:
		writeItems(b, "[", "]", v.Items)
	case pyTuple:
		if len(v.Items) == 1 {
			writeItems(b, "(", ",)", v.Items) // (x,) is a tuple, (x) is x
		} else {
			writeItems(b, "(", ")", v.Items)
		}
	case pySet:
		writeItems(b, "{", "}", v.Items)
	case pyDict:
		b.WriteByte('{')
		for i := 0; i+1 < len(v.Items); i += 2 {
			if i > 0 {
				b.WriteString(", ")
			}
			v.Items[i].writeRepr(b)
			b.WriteString(": ")
			v.Items[i+1].writeRepr(b)
		}
		b.WriteByte('}')
	case pyCall:
		b.WriteString(v.Text)
		b.WriteByte('(')
		for i, a := range v.Args {
			if i > 0 {
				b.WriteString(", ")
			}
			if a.Key != "" {
				b.WriteString(a.Key + "=")
			}
			a.Val.writeRepr(b)
		}
		b.WriteByte(')')
	default:
		b.WriteString(v.Text)
	}
}

func writeItems(b *strings.Builder, open, close string, items []pyValue) {
	b.WriteString(open)
	for i, it := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		it.writeRepr(b)
	}
	b.WriteString(close)
}

// writeQuoted quotes s as Python's repr does: single quotes unless s holds
// a single quote and no double quote.
func writeQuoted(b *strings.Builder, s string) {
	q := '\''
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	b.WriteRune(q)
	for _, r := range s {
		switch {
		case r == q || r == '\\':
			b.WriteRune('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			fmt.Fprintf(b, `\U%08x`, r)
		}
	}
	b.WriteRune(q)
}
