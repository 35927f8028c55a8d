// Package wraptest writes engine lines the way log stores wrap them (CRI,
// Docker's json-file, journald's short formats), for the tests of the
// packages that take the wrappers off again.
package wraptest

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Stream picks the stream of line i: the engines log to stderr and print
// to stdout, so tests interleave both.
func Stream(i int) string {
	if i%3 == 0 {
		return "stdout"
	}
	return "stderr"
}

// chunks splits s into pieces of at most n bytes (one empty piece for "").
// With runes set a piece never ends inside a UTF-8 sequence: Docker
// splits bytes too, but its JSON encoder then writes each half of a cut
// character as U+FFFD, which a test comparing text cannot want.
func chunks(s string, n int, runes bool) []string {
	if n <= 0 || len(s) <= n {
		return []string{s}
	}
	var out []string
	for len(s) > n {
		cut := n
		for runes && cut > 1 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}

// CRI writes lines as containerd and CRI-O do: each line split into "P"
// chunks of at most split bytes and an "F" chunk that ends it (split 0:
// never), stamped one millisecond apart from start.
func CRI(lines []string, start time.Time, split int) string {
	var b strings.Builder
	t := start
	for i, line := range lines {
		parts := chunks(line, split, false)
		for j, part := range parts {
			tag := "P"
			if j == len(parts)-1 {
				tag = "F"
			}
			fmt.Fprintf(&b, "%s %s %s %s\n", t.UTC().Format(time.RFC3339Nano), Stream(i), tag, part)
			t = t.Add(time.Millisecond)
		}
	}
	return b.String()
}

// DockerJSON writes lines as Docker's json-file driver does: one JSON
// object per line, a line longer than split bytes (Docker: 16 KiB) in
// several objects of which only the last ends in "\n".
func DockerJSON(lines []string, start time.Time, split int) string {
	var b strings.Builder
	t := start
	for i, line := range lines {
		parts := chunks(line, split, true)
		for j, part := range parts {
			if j == len(parts)-1 {
				part += "\n"
			}
			entry, err := json.Marshal(struct {
				Log    string `json:"log"`
				Stream string `json:"stream"`
				Time   string `json:"time"`
			}{part, Stream(i), t.UTC().Format(time.RFC3339Nano)})
			if err != nil {
				panic(err) // strings always marshal
			}
			b.Write(entry)
			b.WriteByte('\n')
			t = t.Add(time.Millisecond)
		}
	}
	return b.String()
}

// Journald formats, as journalctl -o names them.
const (
	Short           = "short"
	ShortPrecise    = "short-precise"
	ShortISO        = "short-iso"
	ShortISOPrecise = "short-iso-precise"
	Cat             = "cat"
)

// Journal writes lines as journalctl prints them in format, for a unit
// whose process is ident[pid] on host.
func Journal(lines []string, format string, start time.Time, host, ident string, pid int) string {
	var b strings.Builder
	t := start.UTC()
	for _, line := range lines {
		var stamp string
		switch format {
		case Short:
			stamp = t.Format(time.Stamp)
		case ShortPrecise:
			stamp = t.Format(time.StampMicro)
		case ShortISO:
			stamp = t.Format("2006-01-02T15:04:05-0700")
		case ShortISOPrecise:
			stamp = t.Format("2006-01-02T15:04:05.000000-07:00")
		case Cat:
			b.WriteString(line + "\n")
			continue
		default:
			panic("wraptest: unknown journal format " + format)
		}
		fmt.Fprintf(&b, "%s %s %s[%d]: %s\n", stamp, host, ident, pid, line)
		t = t.Add(time.Millisecond)
	}
	return b.String()
}

// Timestamps writes lines as `kubectl logs --timestamps` and `docker logs
// -t` print them: "<RFC 3339 time, nanoseconds, UTC> <line>", stamped one
// millisecond apart from start.
func Timestamps(lines []string, start time.Time) string {
	var b strings.Builder
	t := start.UTC()
	for _, line := range lines {
		fmt.Fprintf(&b, "%s %s\n", t.Format("2006-01-02T15:04:05.000000000Z07:00"), line)
		t = t.Add(time.Millisecond)
	}
	return b.String()
}
