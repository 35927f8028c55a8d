package enginelog

import "testing"

// FuzzPythonLiteral: parsing never panics, and a parsed value's repr
// parses back to the same repr.
func FuzzPythonLiteral(f *testing.F) {
	for _, s := range []string{
		`{'model_tag': 'Qwen/Qwen3-8B', 'api_key': '***', 'served_model_name': ['a'], 'x': (1,), 'y': {1, 2}}`,
		`ServerArgs(model_path='m', dp_size=2, enum=<E.A: 'a'>, f=-inf, d=device(type='cuda', index=0), s="it's")`,
		`r'\d' b'\x00' u'\u00e9' '\U0001F600' '\N{DASH}' '''t'''`,
		`[1e-05, 0x1F, 1_000, .5, 2j, -1.5E+3, True, None, ...]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parsePyDictArgs(s)
		parsePyCallArgs(s)
		v, err := parsePyLiteral(s)
		if err != nil {
			return
		}
		r := v.repr()
		v2, err := parsePyLiteral(r)
		if err != nil {
			t.Fatalf("repr %q of %q does not parse: %v", r, s, err)
		}
		if r2 := v2.repr(); r2 != r {
			t.Fatalf("repr not stable: %q -> %q -> %q", s, r, r2)
		}
		_ = v.plain()
	})
}
