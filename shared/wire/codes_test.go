package wire

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 10, "abcdefg…"},
		{"ééééé", 7, "éé…"}, // é is 2 bytes; a cut inside the third é steps back
		{"abc", 2, ""},
	} {
		got := Clip(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
		if len(got) > tc.max || !utf8.ValidString(got) {
			t.Errorf("Clip(%q, %d) = %q: %d bytes, valid %v", tc.in, tc.max, got, len(got), utf8.ValidString(got))
		}
	}
	long := strings.Repeat("日本", 1000)
	if got := Clip(long, MaxStringBytes); len(got) > MaxStringBytes || !utf8.ValidString(got) {
		t.Errorf("long: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
