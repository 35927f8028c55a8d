package enginelog

import (
	"strings"
	"testing"
)

func TestParsePyLiteral(t *testing.T) {
	tests := []struct {
		in, plain, repr string
		kind            pyKind
	}{
		{`'Qwen/Qwen3-8B'`, "Qwen/Qwen3-8B", `'Qwen/Qwen3-8B'`, pyStr},
		{`"it's"`, "it's", `"it's"`, pyStr},
		{`'both \' and "'`, `both ' and "`, `'both \' and "'`, pyStr},
		{`'tab\there\\ \x41\u00e9\U0001F600 \101 \q \N{DASH}'`, "tab\there\\ Aé😀 A \\q \\N{DASH}", `'tab\there\\ Aé😀 A \\q \\N{DASH}'`, pyStr},
		{`r'\d+\''`, `\d+\'`, `"\\d+\\'"`, pyStr},
		{`b'\x00bytes'`, "\x00bytes", `'\x00bytes'`, pyStr},
		{`'''tri'ple'''`, "tri'ple", `"tri'ple"`, pyStr},
		{`'***'`, "***", `'***'`, pyStr},
		{`42`, "42", "42", pyInt},
		{`-7`, "-7", "-7", pyInt},
		{`123456789012345678901234567890`, "123456789012345678901234567890", "123456789012345678901234567890", pyInt},
		{`0x1F`, "0x1F", "0x1F", pyInt},
		{`0.9`, "0.9", "0.9", pyFloat},
		{`1e-05`, "1e-05", "1e-05", pyFloat},
		{`-1.5E+3`, "-1.5E+3", "-1.5E+3", pyFloat},
		{`.5`, ".5", ".5", pyFloat},
		{`2j`, "2j", "2j", pyFloat},
		{`inf`, "inf", "inf", pyName},
		{`-inf`, "-inf", "-inf", pyName},
		{`True`, "True", "True", pyBool},
		{`None`, "None", "None", pyNone},
		{`torch.bfloat16`, "torch.bfloat16", "torch.bfloat16", pyName},
		{`...`, "...", "...", pyName},
		{`<LoadFormat.AUTO: 'auto'>`, "<LoadFormat.AUTO: 'auto'>", "<LoadFormat.AUTO: 'auto'>", pyRaw},
		{`<function f at 0x7f <nested> '>'>`, `<function f at 0x7f <nested> '>'>`, `<function f at 0x7f <nested> '>'>`, pyRaw},
		{`['a', 1, None]`, "['a', 1, None]", "['a', 1, None]", pyList},
		{`[ 'a' , 1 , ]`, "['a', 1]", "['a', 1]", pyList},
		{`()`, "()", "()", pyTuple},
		{`(1,)`, "(1,)", "(1,)", pyTuple},
		{`(1, 'x')`, "(1, 'x')", "(1, 'x')", pyTuple},
		{`(5)`, "5", "5", pyInt},
		{`{}`, "{}", "{}", pyDict},
		{`{'a': {'b': [1, (2,)]}, 3: None}`, "{'a': {'b': [1, (2,)]}, 3: None}", "{'a': {'b': [1, (2,)]}, 3: None}", pyDict},
		{`{'x', 'y'}`, "{'x', 'y'}", "{'x', 'y'}", pySet},
		{`set()`, "set()", "set()", pyCall},
		{`ServerArgs(a=1, b='x', c=[1], d=device(type='cuda'))`, "ServerArgs(a=1, b='x', c=[1], d=device(type='cuda'))", "ServerArgs(a=1, b='x', c=[1], d=device(type='cuda'))", pyCall},
		{`PosixPath('/models/x')`, "PosixPath('/models/x')", "PosixPath('/models/x')", pyCall},
		{`'\x7f\xa0'`, "\x7f\u00a0", `'\x7f\xa0'`, pyStr},
		{"'bad \xff byte'", "bad \ufffd byte", "'bad \ufffd byte'", pyStr},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			v, err := parsePyLiteral(tc.in)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if v.Kind != tc.kind || v.plain() != tc.plain || v.repr() != tc.repr {
				t.Errorf("kind %d plain %q repr %q, want kind %d plain %q repr %q", v.Kind, v.plain(), v.repr(), tc.kind, tc.plain, tc.repr)
			}
		})
	}
}

func TestParsePyLiteralErrors(t *testing.T) {
	for _, in := range []string{
		``, `'open`, `"a\"`, `[1, 2`, `{'a' 1}`, `{'a': 1, 'b'}`, `(1 2)`, `1.2.3`, `12abc`, `@`, `'\x4'`, `'\U00110000'`,
		"'new\nline'", `<unclosed`, `[1] 2`, `f(a=)`, `-`, `'a' 'b'`,
		strings.Repeat("[", 200) + strings.Repeat("]", 200),
	} {
		if v, err := parsePyLiteral(in); err == nil {
			t.Errorf("parse(%q) = %+v, want an error", in, v)
		}
	}
	_, err := parsePyLiteral(strings.Repeat("(", 1000))
	if err == nil || !strings.Contains(err.Error(), errPyDepth.Error()) {
		t.Errorf("deep nesting: err = %v", err)
	}
}

func TestParsePyArgsPartial(t *testing.T) {
	pairs, err := parsePyDictArgs(`{'a': 1, 'b': [2, 3], 'c': 'cut sh`)
	if err == nil || len(pairs) != 2 || pairs[1].Key != "b" || pairs[1].Val.plain() != "[2, 3]" {
		t.Fatalf("pairs %+v err %v", pairs, err)
	}
	name, args, err := parsePyCallArgs(`Namespace(host=None, port=8000, 'positional', x=-inf)trailing`)
	if err != nil || name != "Namespace" || len(args) != 4 || args[2].Key != "" || args[3].Val.plain() != "-inf" {
		t.Fatalf("name %q args %+v err %v", name, args, err)
	}
	if _, _, err := parsePyCallArgs(`123`); err == nil {
		t.Error("want an error for a call without a name")
	}
	if _, err := parsePyDictArgs(`[1]`); err == nil {
		t.Error("want an error for a non-dict")
	}
}
