package logsource

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
)

// journalRemote is Debian's systemd-journal-remote, which writes a real
// journal file from the journal export format. The tests read that file
// back with the real journalctl.
const journalRemote = "/usr/lib/systemd/systemd-journal-remote"

// journalTools skips the test when the tools are missing, and fails it
// when HEFT_REQUIRE_JOURNALD is set: CI sets it and installs them
// (.ci/run: systemd, systemd-journal-remote).
func journalTools(t *testing.T) {
	t.Helper()
	missing := ""
	if _, err := exec.LookPath("journalctl"); err != nil {
		missing = "journalctl (Debian: apt-get install systemd)"
	} else if _, err := os.Stat(journalRemote); err != nil {
		missing = journalRemote + " (Debian: apt-get install systemd-journal-remote)"
	}
	switch {
	case missing == "":
	case os.Getenv("HEFT_REQUIRE_JOURNALD") != "":
		t.Fatalf("%s is not installed and HEFT_REQUIRE_JOURNALD is set", missing)
	default:
		t.Skipf("%s is not installed; set HEFT_REQUIRE_JOURNALD=1 to make this a failure", missing)
	}
}

// journalFile appends entries to a journal file in dir, through
// systemd-journal-remote.
type journalFile struct {
	t    *testing.T
	dir  string
	tick int64 // realtime and monotonic clocks, one microsecond a line
	buf  bytes.Buffer
}

func newJournal(t *testing.T) *journalFile {
	journalTools(t)
	return &journalFile{t: t, dir: t.TempDir(), tick: t0.UnixMicro()}
}

// add queues one entry of unit's invocation with MESSAGE msg. A message
// that is not valid UTF-8 goes in the export format's binary form, and
// journalctl gives it back as a byte array.
func (j *journalFile) add(unit, invocation string, msg []byte) {
	j.tick++
	fields := []struct {
		k string
		v []byte
	}{
		{"__REALTIME_TIMESTAMP", fmt.Appendf(nil, "%d", j.tick)},
		{"__MONOTONIC_TIMESTAMP", fmt.Appendf(nil, "%d", j.tick-t0.UnixMicro()+1_000_000)},
		{"_BOOT_ID", []byte("0123456789abcdef0123456789abcdef")},
		{"_HOSTNAME", []byte("gpu-a")},
		{"_SYSTEMD_UNIT", []byte(unit)},
		{"_SYSTEMD_INVOCATION_ID", []byte(invocation)},
		{"SYSLOG_IDENTIFIER", []byte("python3")},
		{"MESSAGE", msg},
	}
	for _, f := range fields {
		if bytes.ContainsAny(f.v, "\n") || !utf8Valid(f.v) {
			j.buf.WriteString(f.k + "\n")
			binary.Write(&j.buf, binary.LittleEndian, uint64(len(f.v)))
			j.buf.Write(f.v)
			j.buf.WriteByte('\n')
			continue
		}
		j.buf.WriteString(f.k + "=")
		j.buf.Write(f.v)
		j.buf.WriteByte('\n')
	}
	j.buf.WriteByte('\n')
}

func utf8Valid(b []byte) bool { return strings.ToValidUTF8(string(b), "\uFFFD") == string(b) }

// lines queues one entry per line.
func (j *journalFile) lines(unit, invocation string, lines []string) {
	for _, l := range lines {
		j.add(unit, invocation, []byte(l))
	}
}

// write appends the queued entries to the journal file.
func (j *journalFile) write() {
	j.t.Helper()
	cmd := exec.Command(journalRemote, "--output="+filepath.Join(j.dir, "system.journal"), "-")
	cmd.Stdin = bytes.NewReader(j.buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		j.t.Fatalf("systemd-journal-remote: %v: %s", err, out)
	}
	j.buf.Reset()
}

const (
	invA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	invB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// currentRun is the SGLang DP2 log with pools 24,094 and 2,925, its DP1
// pool line ending in a byte that is not UTF-8 (journalctl then prints
// MESSAGE as a byte array), and coloured as on a terminal.
func currentRun(t *testing.T) []string {
	lines := fixtureLines(t, "logs/sglang-dp2-uneven.log")
	for i, l := range lines {
		if strings.Contains(l, "DP1] max_total_num_tokens=") {
			lines[i] = l + " \xff"
		}
		if strings.Contains(l, "DP0] max_total_num_tokens=") {
			lines[i] = "\x1b[32m" + l + "\x1b[0m"
		}
	}
	return lines
}

func TestJournaldReadAllReadsTheNewestInvocation(t *testing.T) {
	j := newJournal(t)
	j.lines("sglang.service", invA, fixtureLines(t, "engines/sglang-dp2-even.log"))
	j.lines("other.service", "cccccccccccccccccccccccccccccccc", []string{"[2026-03-02 10:15:21 DP5] max_total_num_tokens=1, x=1"})
	cur := currentRun(t)
	j.lines("sglang.service", invB, cur)
	j.write()

	src, err := Open("journald:sglang", Options{JournalDirectory: j.dir}, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	got, resets := rec.got()
	if !slices.Equal(got, cur) || len(resets) != 0 {
		t.Fatalf("read %d lines (want %d, the newest invocation's), resets %q", len(got), len(cur), resets)
	}
	f, _ := rec.tracker.Facts()
	if !slices.Equal(f.Ranks, ranks(0, 24094, 1, 2925)) || f.Restarts != 0 || !f.Complete {
		t.Fatalf("facts %+v", f)
	}
	st := src.Status()
	if st.Resolved != "unit sglang.service, invocation "+invB || st.Via != "journalctl --directory="+j.dir || st.Lines != int64(len(cur)) || st.Runs != 1 {
		t.Fatalf("status %+v", st)
	}
}

func TestJournaldFollowsIntoANewInvocation(t *testing.T) {
	j := newJournal(t)
	j.lines("sglang.service", invA, fixtureLines(t, "engines/sglang-dp2-even.log"))
	j.write()
	src, _ := Open("journald:sglang.service", fast(Options{JournalDirectory: j.dir}), logger(t))
	rec := newRecorder(t, "sglang")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "the first invocation's pools", 20*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24094, 1, 24037)) })

	cur := currentRun(t)
	j.lines("sglang.service", invB, cur)
	j.write()
	testutil.Eventually(t, "the new invocation's pools", 20*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24094, 1, 2925)) })
	testutil.Eventually(t, "every line", 20*time.Second, func() bool {
		l, _ := rec.got()
		return len(l) == len(fixtureLines(t, "engines/sglang-dp2-even.log"))+len(cur)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, resets := rec.got(); !slices.Equal(resets, []string{ReasonRestarted}) {
		t.Fatalf("resets %q", resets)
	}
	if st := src.Status(); st.Resolved != "unit sglang.service, invocation "+invB || st.Runs != 2 {
		t.Fatalf("status %+v", st)
	}
}

// A journalctl that ends mid-read is started again after the last entry
// read: nothing twice, nothing lost.
func TestJournaldResumesAfterTheCursor(t *testing.T) {
	j := newJournal(t)
	cur := currentRun(t)
	j.lines("sglang.service", invB, cur)
	j.write()
	// A journalctl that, the first time it is asked to follow, prints five
	// entries and ends.
	dir := t.TempDir()
	script := filepath.Join(dir, "journalctl")
	writeFile(t, script, `#!/bin/bash
args=(); follow=
for a in "$@"; do case "$a" in --follow) follow=1;; --no-tail) ;; *) args+=("$a");; esac; done
if [[ -n $follow && ! -e `+dir+`/cut ]]; then : > `+dir+`/cut; journalctl "${args[@]}" | head -n 5; exit 0; fi
exec journalctl "$@"
`)
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	src, _ := Open("journald:sglang", fast(Options{JournalDirectory: j.dir, Journalctl: script}), logger(t))
	rec := newRecorder(t, "sglang")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "every line", 20*time.Second, func() bool { l, _ := rec.got(); return len(l) >= len(cur) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cut")); err != nil {
		t.Fatal("the cut journalctl never ran")
	}
	got, resets := rec.got()
	if !slices.Equal(got, cur) || len(resets) != 0 {
		t.Fatalf("read %d lines, want %d; resets %q", len(got), len(cur), resets)
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 24094, 1, 2925)) {
		t.Fatalf("ranks %v", r)
	}
	if st := src.Status(); !strings.Contains(st.LastError, "journalctl --follow ended") {
		t.Fatalf("status %+v", st)
	}
}

func TestJournaldErrors(t *testing.T) {
	j := newJournal(t)
	j.lines("sglang.service", invB, []string{"hello"})
	j.write()
	src, _ := Open("journald:nope", Options{JournalDirectory: j.dir}, nil)
	rec := newRecorder(t, "sglang")
	for _, follow := range []bool{false, true} {
		var err error
		if follow {
			err = src.Follow(context.Background(), rec.handler())
		} else {
			err = src.ReadAll(context.Background(), rec.handler())
		}
		if err == nil || !strings.Contains(err.Error(), "no entries for unit nope.service in the journal in "+j.dir) ||
			!strings.Contains(err.Error(), "systemd-journal group") {
			t.Errorf("follow %v: err %v", follow, err)
		}
	}
	src, _ = Open("journald:sglang", Options{JournalDirectory: j.dir, Journalctl: filepath.Join(t.TempDir(), "journalctl")}, nil)
	if err := src.ReadAll(context.Background(), rec.handler()); err == nil || !strings.Contains(err.Error(), "journalctl cannot be run") {
		t.Errorf("err %v", err)
	}
	// A journal folder that does not exist.
	src, _ = Open("journald:sglang", Options{JournalDirectory: filepath.Join(t.TempDir(), "absent")}, nil)
	if err := src.ReadAll(context.Background(), rec.handler()); err == nil || !strings.Contains(err.Error(), "journald: ") {
		t.Errorf("err %v", err)
	}
	if got, _ := rec.got(); len(got) != 0 {
		t.Errorf("lines read: %q", got)
	}
}
