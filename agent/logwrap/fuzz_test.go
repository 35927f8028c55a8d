package logwrap_test

import (
	"slices"
	"strings"
	"testing"
	"unicode"

	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
)

// cleanLines makes fuzz text into lines an engine could print: valid
// UTF-8 without control characters other than tab and escape (a line
// the unwrapper would rightly drop as binary cannot round-trip).
func cleanLines(text string) []string {
	text = strings.ToValidUTF8(text, "?")
	text = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || r == 0x1b || !unicode.IsControl(r) {
			return r
		}
		return -1
	}, text)
	return strings.Split(text, "\n")
}

// unwrapAll unwraps text with a small line limit, checking the
// invariants every input keeps: no panic, no line beyond the limit unless
// it came in whole, counts that add up.
func unwrapAll(t *testing.T, text string, limit int) []string {
	var out []string
	u := logwrap.New(func(l string) { out = append(out, l) }, logwrap.Options{MaxLineBytes: limit})
	in := strings.Split(text, "\n")
	longest := 0
	for _, l := range in {
		longest = max(longest, len(l))
		u.Line(l)
	}
	u.Flush()
	st := u.Stats()
	if st.Lines != int64(len(in)) || st.Emitted != int64(len(out)) || st.SkippedTotal() > st.Lines {
		t.Fatalf("stats %+v for %d lines in, %d out", st, len(in), len(out))
	}
	for _, l := range out {
		if len(l) > max(limit, longest) {
			t.Fatalf("line of %d bytes, limit %d, longest input %d", len(l), limit, longest)
		}
	}
	return out
}

// FuzzUnwrapCRI: CRI-wrapped lines, split into chunks of any size, come
// back exactly; arbitrary input never panics.
func FuzzUnwrapCRI(f *testing.F) {
	for _, s := range sample {
		f.Add(s, uint8(0))
	}
	f.Add(wraptest.CRI(sample, t0, 7), uint8(3))
	f.Add("2026-03-02T10:15:21Z stdout P \n2026-03-02T10:15:21Z stdout\n2026-03-02T10:15:21Z stderr X y", uint8(1))
	f.Fuzz(func(t *testing.T, text string, split uint8) {
		unwrapAll(t, text, 64)
		lines := cleanLines(text)
		got := unwrapAll(t, strings.TrimSuffix(wraptest.CRI(lines, t0, int(split)), "\n"), 1<<20)
		if !slices.Equal(got, lines) {
			t.Fatalf("round trip\n got %q\nwant %q", got, lines)
		}
	})
}

// FuzzUnwrapDockerJSON: json-file entries, a line split over several, come
// back exactly; arbitrary input never panics.
func FuzzUnwrapDockerJSON(f *testing.F) {
	for _, s := range sample {
		f.Add(s, uint8(0))
	}
	f.Add(wraptest.DockerJSON(sample, t0, 5), uint8(2))
	f.Add(`{"log":"a`+"\n"+`{"log":"\ud800 x\n","stream":"stdout","time":"bad"}`+"\n"+`{"log":1}`, uint8(0))
	f.Fuzz(func(t *testing.T, text string, split uint8) {
		unwrapAll(t, text, 64)
		lines := cleanLines(text)
		for i := range lines {
			// Docker ends a TTY's lines with "\r\n", which is taken off.
			lines[i] = strings.TrimRight(lines[i], "\r")
		}
		got := unwrapAll(t, strings.TrimSuffix(wraptest.DockerJSON(lines, t0, max(int(split), 4)), "\n"), 1<<20)
		if !slices.Equal(got, lines) {
			t.Fatalf("round trip\n got %q\nwant %q", got, lines)
		}
	})
}

// FuzzUnwrapJournal: journalctl's short formats come back exactly;
// arbitrary input never panics.
func FuzzUnwrapJournal(f *testing.F) {
	formats := []string{wraptest.Short, wraptest.ShortPrecise, wraptest.ShortISO, wraptest.ShortISOPrecise}
	for _, s := range sample {
		f.Add(s, uint8(0), "gpu-a", "python3")
	}
	f.Add("Mar  2 10:15:21 h x[1]: \n[ 1.5] h y: z", uint8(1), "h", "vllm")
	f.Fuzz(func(t *testing.T, text string, format uint8, host, ident string) {
		unwrapAll(t, text, 64)
		// journalctl never prints an empty host or identifier, nor one with
		// a space, a colon or brackets.
		valid := func(s string) bool {
			return s != "" && !strings.ContainsAny(s, " \t\n\r:[]") && strings.ToValidUTF8(s, "") == s &&
				!strings.ContainsFunc(s, unicode.IsControl) && !strings.ContainsFunc(s, unicode.IsSpace)
		}
		if !valid(host) || !valid(ident) {
			return
		}
		lines := cleanLines(text)
		got := unwrapAll(t, strings.TrimSuffix(wraptest.Journal(lines, formats[int(format)%len(formats)], t0, host, ident, 7), "\n"), 1<<20)
		if !slices.Equal(got, lines) {
			t.Fatalf("round trip\n got %q\nwant %q", got, lines)
		}
	})
}
