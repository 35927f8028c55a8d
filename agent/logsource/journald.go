package logsource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"
	"sync"
	"time"

	"heft/agent/logfollow"
)

// journalEntry is what heft reads of one line of journalctl -o json.
type journalEntry struct {
	Cursor     string          `json:"__CURSOR"`
	Invocation json.RawMessage `json:"_SYSTEMD_INVOCATION_ID"`
	Message    json.RawMessage `json:"MESSAGE"`
}

// invocation is the entry's _SYSTEMD_INVOCATION_ID, "" when it has none.
func (e journalEntry) invocation() string {
	var s string
	if json.Unmarshal(e.Invocation, &s) != nil {
		return ""
	}
	return s
}

// messages decodes MESSAGE: a string; an array of byte values when it is
// not valid UTF-8 (or holds control characters journalctl will not print
// as text); an array of either when the field was given several times;
// null when journalctl left it out.
func (e journalEntry) messages() []string {
	if len(e.Message) == 0 || string(e.Message) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(e.Message, &s) == nil {
		return []string{s}
	}
	if b, ok := byteArray(e.Message); ok {
		return []string{string(b)}
	}
	var many []json.RawMessage
	if json.Unmarshal(e.Message, &many) != nil {
		return nil
	}
	var out []string
	for _, m := range many {
		out = append(out, journalEntry{Message: m}.messages()...)
	}
	return out
}

// byteArray decodes a JSON array of numbers 0-255.
func byteArray(msg json.RawMessage) ([]byte, bool) {
	var nums []int
	if json.Unmarshal(msg, &nums) != nil {
		return nil, false
	}
	b := make([]byte, len(nums))
	for i, n := range nums {
		if n < 0 || n > 255 {
			return nil, false
		}
		b[i] = byte(n)
	}
	return b, true
}

// journalMaxEntry bounds one JSON entry read from journalctl.
const journalMaxEntry = 4 << 20

// errJournalctlMissing is wrapped when journalctl cannot be run at all.
var errJournalctlMissing = errors.New("journalctl cannot be run")

// journal runs journalctl with the source's options and args, calling fn
// for every entry until fn returns false. It returns journalctl's stderr
// and an error when journalctl could not start or failed.
func (s *Source) journal(ctx context.Context, args []string, fn func(journalEntry) bool) (string, error) {
	base := []string{"--no-pager", "--output=json", "--all"}
	if dir := s.opts.JournalDirectory; dir != "" {
		base = append(base, "--directory="+dir)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.opts.Journalctl, append(base, args...)...)
	cmd.WaitDelay = 5 * time.Second
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("journald: %w: %v (install systemd's journalctl, or set its path)", errJournalctlMissing, err)
		}
		return "", fmt.Errorf("journald: start %s: %w", s.opts.Journalctl, err)
	}
	stopped := false
	readErr := logfollow.ReadLines(out, journalMaxEntry, func(line string) {
		if stopped || line == "" {
			return
		}
		var e journalEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			s.note("a journal entry could not be read: %v", err)
			return
		}
		if !fn(e) {
			stopped = true
			cancel()
		}
	})
	waitErr := cmd.Wait()
	if stopped {
		return stderr.String(), nil
	}
	if ctx.Err() != nil {
		return stderr.String(), ctx.Err()
	}
	if waitErr != nil {
		return stderr.String(), fmt.Errorf("journald: journalctl: %v: %s", waitErr, strings.TrimSpace(stderr.String()))
	}
	if readErr != nil {
		return stderr.String(), fmt.Errorf("journald: read journalctl's output: %w", readErr)
	}
	return stderr.String(), nil
}

// limitedBuffer keeps the first 4 KiB written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := 4096 - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// journalStart finds where the unit's current run starts: the cursor of
// the first entry of the newest invocation in the journal (empty when
// its entries carry no invocation ID: the whole journal of the unit is
// read, and the tracker keeps the last start-up).
func (s *Source) journalStart(ctx context.Context, match string) (cursor, invocation string, err error) {
	found := false
	stderr, err := s.journal(ctx, []string{"--reverse", "--lines=1", match}, func(e journalEntry) bool {
		found, invocation = true, e.invocation()
		return false
	})
	if err != nil {
		return "", "", err
	}
	if !found {
		where := "the system journal"
		if s.opts.JournalDirectory != "" {
			where = "the journal in " + s.opts.JournalDirectory
		}
		hint := ""
		if stderr = strings.TrimSpace(stderr); stderr != "" {
			hint = "; journalctl says: " + stderr
		}
		return "", "", fmt.Errorf("journald: no entries for unit %s in %s: the unit does not exist, has not run, or the agent's user may not read the journal (add it to the systemd-journal group)%s",
			s.spec.Unit, where, hint)
	}
	if invocation == "" {
		s.note("the journal entries of %s carry no invocation ID: reading all of them", s.spec.Unit)
		return "", "", nil
	}
	_, err = s.journal(ctx, []string{match, "_SYSTEMD_INVOCATION_ID=" + invocation}, func(e journalEntry) bool {
		cursor = e.Cursor
		return false
	})
	return cursor, invocation, err
}

// readJournal reads the unit's newest invocation through journalctl, from
// its first entry; following, journalctl --follow goes on into later
// invocations (ReasonRestarted), and a journalctl that ends is started
// again after the last entry read.
func (s *Source) readJournal(ctx context.Context, h Handler, follow bool) error {
	match := "_SYSTEMD_UNIT=" + s.spec.Unit
	cursor, invocation, err := s.journalStart(ctx, match)
	if err != nil {
		return err
	}
	via := "journalctl"
	if dir := s.opts.JournalDirectory; dir != "" {
		via += " --directory=" + dir
	}
	describe := func() string {
		if invocation == "" {
			return "unit " + s.spec.Unit
		}
		return "unit " + s.spec.Unit + ", invocation " + invocation
	}
	s.resolved(describe(), via)
	s.newRun()
	after := false
	for {
		args := []string{match}
		switch {
		case cursor != "" && after:
			args = append(args, "--after-cursor="+cursor)
		case cursor != "":
			args = append(args, "--cursor="+cursor)
		}
		if follow {
			args = append(args, "--follow", "--no-tail")
		}
		entries := 0
		stderr, err := s.journal(ctx, args, func(e journalEntry) bool {
			entries++
			if id := e.invocation(); id != "" && id != invocation {
				if invocation != "" {
					h.reset(ReasonRestarted)
					s.newRun()
				}
				invocation = id
				s.resolved(describe(), via)
			}
			for _, m := range e.messages() {
				for _, line := range strings.Split(strings.TrimSuffix(m, "\n"), "\n") {
					h.Line(line)
				}
			}
			if e.Cursor != "" {
				cursor, after = e.Cursor, true
			}
			return true
		})
		if !follow || ctx.Err() != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// journalctl --follow ended by itself.
		if err == nil {
			err = fmt.Errorf("journald: journalctl --follow ended: %s", strings.TrimSpace(stderr))
		}
		if entries == 0 {
			return err
		}
		s.recordError(err)
		if !sleep(ctx, s.opts.Rescan/4) {
			return nil
		}
	}
}
