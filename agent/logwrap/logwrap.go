// Package logwrap takes off what a log store wraps around each line the
// engine wrote, so the engine-log parser sees the engine's own text:
//
//   - CRI (Kubernetes, containerd, CRI-O):
//     "<RFC 3339 time> <stdout|stderr> <P|F> <text>". A line the runtime
//     split ("P", partial) is joined with the chunks that follow it up to
//     the "F" (full) that ends it.
//   - Docker's json-file driver: {"log":"text\n","stream":"stdout","time":"..."}
//     per line. Docker splits a line over 16 KiB into entries whose "log"
//     lacks the trailing "\n"; they are joined.
//   - journald and syslog text: "Mon DD HH:MM:SS host ident[pid]: text"
//     (journalctl -o short, short-precise), "2026-03-02T10:15:21+0000 host
//     ident[pid]: text" (short-iso, short-iso-precise, rsyslog's RFC 3339
//     files) and "[  12.345678] host ident[pid]: text" (short-monotonic).
//     journalctl -o cat has no wrapper.
//   - `kubectl logs --timestamps` and `docker logs -t`: "<RFC 3339 time in
//     UTC, Z> <text>", no stream or P/F tag. A line stamped so whose text is
//     "host ident[pid]: ..." is journald's short-iso instead.
//
// Every line is recognised on its own, so a file that mixes formats (a
// raw log appended to a CRI one) is read right; the first lines set what
// the file is expected to hold, which decides only what a line that
// matches no wrapper means: in a Docker json-file, a line starting with
// "{" that does not parse is a cut entry and is skipped; elsewhere it is
// the engine's own text. Lines the unwrapper cannot use (cut JSON, a CRI
// line without its P/F tag, binary garbage) are counted by reason and
// dropped; nothing already emitted changes.
package logwrap

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"heft/shared/wire"
)

// Wrapper names, as Stats reports them.
const (
	None       = "none" // the engine's own text (journalctl -o cat, a redirected stdout)
	CRI        = "cri"
	DockerJSON = "docker-json"
	Syslog     = "syslog"     // "Mon DD HH:MM:SS host ident[pid]: " (journalctl -o short, short-precise)
	SyslogISO  = "syslog-iso" // "2026-03-02T10:15:21+0000 host ident[pid]: " (journalctl -o short-iso)
	SyslogMono = "syslog-monotonic"
	// Timestamps: "<RFC 3339 UTC time> <text>", as `kubectl logs
	// --timestamps` and `docker logs -t` print a container's lines.
	Timestamps = "timestamps"
)

// Reasons a line is skipped, as keys of Stats.Skipped.
const (
	SkipBadJSON    = "docker-json entry cut or malformed"
	SkipNoLogField = "docker-json entry without a log field"
	SkipCRINoTag   = "cri line without a P/F tag"
	SkipBinary     = "binary data"
	SkipOverlong   = "partial chunks beyond the line limit"
	SkipBeforeRun  = "stamped before the run started"
)

// DefaultMaxLineBytes bounds a line joined from partial chunks: a "P"
// chunk (or Docker entry without "\n") that never ends is cut there, and
// the rest of it up to its end is dropped.
const DefaultMaxLineBytes = 64 << 10

// Options tune an Unwrapper. The zero value is ready to use.
type Options struct {
	// Since, when set, drops lines a container runtime stamped before it
	// (CRI and Docker lines carry a time; other lines are kept): reading a
	// container's whole log file, only its current run counts.
	Since time.Time
	// MaxLineBytes bounds a joined line; DefaultMaxLineBytes when 0.
	MaxLineBytes int
}

// Stats describe what an Unwrapper has read so far.
type Stats struct {
	// Wrapper is what the file's first lines were wrapped in (None before
	// any line); Mixed is set once lines in another wrapper were seen too.
	Wrapper string `json:"wrapper"`
	Mixed   bool   `json:"mixed,omitempty"`
	// Lines counts the lines read, Emitted the engine lines given out
	// (partial chunks joined make one).
	Lines   int64 `json:"lines"`
	Emitted int64 `json:"emitted"`
	// ByWrapper counts lines read per wrapper; Skipped counts lines
	// dropped per reason (the Skip* constants).
	ByWrapper map[string]int64 `json:"by_wrapper,omitempty"`
	Skipped   map[string]int64 `json:"skipped,omitempty"`
	// LastProblem describes the last line skipped, with a clipped sample.
	LastProblem string `json:"last_problem,omitempty"`
}

// SkippedTotal is the number of lines skipped for any reason.
func (s Stats) SkippedTotal() int64 {
	var n int64
	for _, v := range s.Skipped {
		n += v
	}
	return n
}

// Unwrapper turns the lines of a wrapped log into the engine's lines.
// Line and Flush must be called from one goroutine (the reader's); Stats
// may be called from any.
type Unwrapper struct {
	emit    func(string)
	since   time.Time
	maxLine int

	// partial lines by wrapper and stream, joined until their end.
	partials map[string]*partial
	// firstSeen counts the wrappers of the first lines, which set what the
	// file is expected to hold: expect, the commonest of them.
	firstSeen map[string]int
	firstN    int
	expect    string

	mu    sync.Mutex
	stats Stats
}

type partial struct {
	buf      []byte
	skipping bool // cut at the line limit: drop chunks up to the end
}

// expectLines is how many lines set what a file is expected to hold.
const expectLines = 8

// New returns an Unwrapper that calls emit with every engine line, in
// order, from the goroutine that calls Line or Flush.
func New(emit func(line string), opts Options) *Unwrapper {
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = DefaultMaxLineBytes
	}
	return &Unwrapper{
		emit: emit, since: opts.Since, maxLine: opts.MaxLineBytes,
		partials: map[string]*partial{}, firstSeen: map[string]int{}, expect: None,
		stats: Stats{Wrapper: None},
	}
}

// Stats returns a copy of the counts so far.
func (u *Unwrapper) Stats() Stats {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.stats
	s.ByWrapper = maps.Clone(s.ByWrapper)
	s.Skipped = maps.Clone(s.Skipped)
	return s
}

// Flush emits every partial line as it is: at the end of the input, and
// before a file is replaced by another.
func (u *Unwrapper) Flush() {
	for _, key := range slices.Sorted(maps.Keys(u.partials)) {
		p := u.partials[key]
		if len(p.buf) > 0 && !p.skipping {
			u.out(string(p.buf))
		}
		delete(u.partials, key)
	}
}

// Line reads one line of the wrapped log, without its line ending.
func (u *Unwrapper) Line(line string) {
	u.count(func(s *Stats) { s.Lines++ })
	if line == "" {
		u.seen(None)
		u.out("")
		return
	}
	if isBinary(line) {
		u.skip(SkipBinary, line)
		return
	}
	switch {
	case line[0] == '{' && (u.expect == DockerJSON || strings.HasPrefix(line, `{"log":`)):
		u.dockerJSON(line)
		return
	case line[0] >= '0' && line[0] <= '9':
		if u.cri(line) || u.timestamped(line) {
			return
		}
	}
	if kind, text, ok := syslogText(line); ok {
		u.seen(kind)
		u.out(text)
		return
	}
	u.seen(None)
	u.out(line)
}

func (u *Unwrapper) out(text string) {
	u.count(func(s *Stats) { s.Emitted++ })
	u.emit(text)
}

func (u *Unwrapper) count(fn func(*Stats)) {
	u.mu.Lock()
	fn(&u.stats)
	u.mu.Unlock()
}

// seen counts a line of wrapper kind and settles the expectation.
func (u *Unwrapper) seen(kind string) {
	if u.firstN < expectLines {
		u.firstN++
		u.firstSeen[kind]++
		n := 0
		for _, k := range slices.Sorted(maps.Keys(u.firstSeen)) {
			if u.firstSeen[k] > n {
				u.expect, n = k, u.firstSeen[k]
			}
		}
	}
	u.count(func(s *Stats) {
		if s.ByWrapper == nil {
			s.ByWrapper = map[string]int64{}
		}
		s.ByWrapper[kind]++
		s.Wrapper = u.expect
		s.Mixed = len(s.ByWrapper) > 1
	})
}

// skipLimit bounds the sample of a skipped line kept in LastProblem.
const skipLimit = 120

func (u *Unwrapper) skip(reason, line string) {
	u.count(func(s *Stats) {
		if s.Skipped == nil {
			s.Skipped = map[string]int64{}
		}
		s.Skipped[reason]++
		sample := strings.ToValidUTF8(wire.Clip(line, skipLimit), "\uFFFD")
		s.LastProblem = fmt.Sprintf("line %d skipped (%s): %q", s.Lines, reason, sample)
	})
}

// part adds a chunk to the partial line of key; end says the chunk ends
// the line, which is then emitted whole. A line is cut at maxLine bytes
// and the chunks after the cut, up to its end, are dropped.
func (u *Unwrapper) part(key, chunk string, end bool, raw string) {
	p := u.partials[key]
	if p == nil && end {
		if len(chunk) > u.maxLine {
			u.out(chunk[:u.maxLine])
			u.skip(SkipOverlong, raw)
			return
		}
		u.out(chunk)
		return
	}
	if p == nil {
		p = &partial{}
		u.partials[key] = p
	}
	if !p.skipping {
		room := u.maxLine - len(p.buf)
		if len(chunk) <= room {
			p.buf = append(p.buf, chunk...)
		} else {
			p.buf = append(p.buf, chunk[:room]...)
			u.out(string(p.buf))
			p.buf, p.skipping = nil, true
			u.skip(SkipOverlong, raw)
		}
	} else {
		u.skip(SkipOverlong, raw)
	}
	if end {
		if !p.skipping {
			u.out(string(p.buf))
		}
		delete(u.partials, key)
	}
}

// before tells whether a runtime's time stamp is before Since.
func (u *Unwrapper) before(stamp string) bool {
	if u.since.IsZero() {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, stamp)
	return err == nil && t.Before(u.since)
}

// cri reads a CRI line; false when line is not one.
func (u *Unwrapper) cri(line string) bool {
	stamp, rest, ok := strings.Cut(line, " ")
	if !ok || !looksRFC3339(stamp) {
		return false
	}
	stream, rest, _ := strings.Cut(rest, " ")
	if stream != "stdout" && stream != "stderr" {
		return false
	}
	u.seen(CRI)
	tag, text, _ := strings.Cut(rest, " ")
	if tag != "P" && tag != "F" {
		u.skip(SkipCRINoTag, line)
		return true
	}
	if u.before(stamp) {
		u.skip(SkipBeforeRun, line)
		return true
	}
	u.part(CRI+" "+stream, text, tag == "F", line)
	return true
}

// timestamped reads a `kubectl logs --timestamps` / `docker logs -t`
// line; false when line is not one. Read before the syslog rules, so an
// engine's own "INFO:     Application startup complete." is not taken
// for a syslog identifier "INFO".
func (u *Unwrapper) timestamped(line string) bool {
	stamp, text, ok := strings.Cut(line, " ")
	if !ok || !strings.HasSuffix(stamp, "Z") || !looksRFC3339(stamp) || syslogIdentRE.MatchString(text) {
		return false
	}
	u.seen(Timestamps)
	if u.before(stamp) {
		u.skip(SkipBeforeRun, line)
		return true
	}
	u.out(text)
	return true
}

// dockerEntry is one line of Docker's json-file log.
type dockerEntry struct {
	Log    *string `json:"log"`
	Stream string  `json:"stream"`
	Time   string  `json:"time"`
}

// dockerJSON reads a line that starts like a json-file entry, or one in
// a file whose first lines were entries.
func (u *Unwrapper) dockerJSON(line string) {
	u.seen(DockerJSON)
	var e dockerEntry
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		u.skip(SkipBadJSON, line)
		return
	}
	if e.Log == nil {
		u.skip(SkipNoLogField, line)
		return
	}
	if u.before(e.Time) {
		u.skip(SkipBeforeRun, line)
		return
	}
	text, end := strings.CutSuffix(*e.Log, "\n")
	if end {
		text = strings.TrimSuffix(text, "\r")
	}
	u.part(DockerJSON+" "+e.Stream, text, end, line)
}

// looksRFC3339 is a cheap check of "2016-10-06T00:17:09.669794202Z".
func looksRFC3339(s string) bool {
	return len(s) >= 20 && s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':' &&
		isDigits(s[:4]) && isDigits(s[5:7]) && isDigits(s[8:10]) && isDigits(s[11:13])
}

func isDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

var (
	// journalctl -o short / short-precise and classic syslog files; the
	// host is absent with --no-hostname. The identifier may lack a pid.
	syslogRE = regexp.MustCompile(`^[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d(?:\.\d{1,9})? (?:\S+ )??[^\s\[\]:]+(?:\[\d+\])?: `)
	// journalctl -o short-iso / short-iso-precise, rsyslog's RFC 3339 files.
	syslogISORE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d) (?:\S+ )??[^\s\[\]:]+(?:\[\d+\])?: `)
	// What follows journald's short-iso time: "host ident[pid]: ".
	syslogIdentRE = regexp.MustCompile(`^(?:\S+ )?[^\s\[\]:]+\[\d+\]: `)
	// journalctl -o short-monotonic.
	syslogMonoRE = regexp.MustCompile(`^\[ *\d+\.\d+\] (?:\S+ )??[^\s\[\]:]+(?:\[\d+\])?: `)
)

// syslogText strips a journald or syslog prefix.
func syslogText(line string) (kind, text string, ok bool) {
	var re *regexp.Regexp
	switch c := line[0]; {
	case c >= 'A' && c <= 'Z':
		re, kind = syslogRE, Syslog
	case c >= '0' && c <= '9':
		re, kind = syslogISORE, SyslogISO
	case c == '[':
		re, kind = syslogMonoRE, SyslogMono
	default:
		return "", "", false
	}
	m := re.FindStringIndex(line)
	if m == nil {
		return "", "", false
	}
	return kind, line[m[1]:], true
}

// isBinary tells a line of binary data from text: a NUL, or more than
// one byte in eight that is a control character (other than tab, escape
// and carriage return) or not UTF-8.
func isBinary(s string) bool {
	if strings.IndexByte(s, 0) >= 0 {
		return true
	}
	bad := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\r' && c != 0x1b || c == 0x7f {
				bad++
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			bad++
		}
		i += n
	}
	return bad*8 > len(s)
}
