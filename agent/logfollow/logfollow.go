// Package logfollow follows a growing log file line by line, like tail -F:
// it waits for the file to appear, reads what is appended, and keeps going
// across rotation by rename, copytruncate truncation, and deletion and
// re-creation; a deleted file that stopped growing is closed. It polls
// (no inotify), so it works the same on Linux and macOS and on any file
// system, and its memory stays flat however large the file: it streams
// through a fixed buffer and holds at most one line.
//
// Truncation is seen as a shrink below the bytes already read, or as a
// change of the file's first 4 KiB (a file rewritten in place between
// two polls, as a quickly restarted engine writing with `>` does). Limits:
// a rewrite that keeps those 4 KiB (the first lines, with the engine's launch
// arguments, and their time stamps) and refills past the old offset
// between two polls is read on from the old offset; and after a
// rename rotation, lines a writer still appends to the old file once the
// new one exists are not read.
package logfollow

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// Reasons passed to Options.OnReset.
const (
	// ReasonTruncated: the file shrank in place (logrotate copytruncate);
	// it is read again from its start.
	ReasonTruncated = "truncated"
	// ReasonReplaced: the path now names another file (rename rotation, or
	// deletion and re-creation); the old file was read to its end first.
	ReasonReplaced = "replaced"
)

// Options tune Follow. The zero value is ready to use.
type Options struct {
	// Poll is how often the file is checked once all of it was read.
	// Default 250ms.
	Poll time.Duration
	// FromStart reads what the file already holds before following it.
	// It is the default: content is skipped only with FromEnd.
	FromStart bool
	// FromEnd skips what the file holds when Follow starts and delivers only
	// lines appended later. Ignored when FromStart is set. A file that does
	// not exist yet, or one that replaces it later, is always read whole.
	FromEnd bool
	// MaxLineBytes bounds one line. A longer line is cut: its first
	// MaxLineBytes bytes are delivered, OnLongLine is called, and the rest
	// up to the newline is skipped without being buffered. Default 1 MiB.
	MaxLineBytes int
	// PartialAfter is how long a last line without its newline waits for
	// the rest before it is delivered as it is. Whatever arrives later is
	// then a line of its own. Default 2s. A partial line is also delivered
	// when the context ends and before a rotation or truncation.
	PartialAfter time.Duration
	// OnReset is called when the file was truncated or replaced, before
	// any line of the new content. reason is ReasonTruncated or
	// ReasonReplaced.
	OnReset func(reason string)
	// OnLongLine is called after a line was cut to kept bytes.
	OnLongLine func(kept int)
	// OnOpen is called each time a file is opened at the path, the first
	// and every replacement, before any of its lines: a caller that reads
	// a file's rotated predecessors itself can read one renamed away just
	// before the open, in order.
	OnOpen func(info os.FileInfo)
	// DeletedGrace is how long a deleted file (no link left: removed, not
	// renamed) that no longer grows stays open, for a writer that may
	// still append to it. Then it is closed, so that it holds no disk
	// space and no stale state, OnDeleted is called and the follower
	// waits for a new file at the path. Default 10s.
	DeletedGrace time.Duration
	// OnDeleted is called when a deleted file was read to its end and
	// closed.
	OnDeleted func()
	// Stop is called each time the file was read to its end, and while it
	// does not exist. When it returns true, Follow delivers an
	// unterminated last line and returns nil: a caller following the
	// newest of several files moves on to another.
	Stop func() bool

	// idle is a test hook, called each time the follower has read all
	// there is (or found no file) and is about to wait.
	idle func()
}

const (
	defaultPoll         = 250 * time.Millisecond
	defaultMaxLineBytes = 1 << 20
	defaultPartialAfter = 2 * time.Second
	defaultDeletedGrace = 10 * time.Second
	chunkBytes          = 64 << 10
)

func (o Options) withDefaults() Options {
	if o.Poll <= 0 {
		o.Poll = defaultPoll
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = defaultMaxLineBytes
	}
	if o.PartialAfter <= 0 {
		o.PartialAfter = defaultPartialAfter
	}
	if o.DeletedGrace <= 0 {
		o.DeletedGrace = defaultDeletedGrace
	}
	return o
}

// Follow calls onLine, from the calling goroutine, for every line of the
// file at path, without its line ending ("\n" or "\r\n"), until ctx ends;
// it then returns nil. It returns an error when the path cannot be read
// (a directory, no permission) or a read fails.
func Follow(ctx context.Context, path string, opts Options, onLine func(line string)) error {
	f := &follower{path: path, opts: opts.withDefaults(), onLine: onLine, buf: make([]byte, chunkBytes)}
	defer f.closeFile()
	skipExisting := f.opts.FromEnd && !f.opts.FromStart
	for {
		if f.file == nil {
			ok, err := f.open(skipExisting)
			if err != nil {
				return err
			}
			skipExisting = false
			if !ok {
				if f.stopped() {
					return nil
				}
				f.idle()
				if !f.wait(ctx) {
					return nil
				}
				continue
			}
			if f.opened {
				f.reset(ReasonReplaced)
			}
			f.opened = true
		}
		if rewritten, err := f.checkHead(); err != nil {
			return f.stop(ctx, err)
		} else if rewritten {
			f.reset(ReasonTruncated)
		}
		if err := f.readAll(ctx); err != nil {
			return f.stop(ctx, err)
		}
		switched, err := f.checkFile(ctx)
		if err != nil {
			return f.stop(ctx, err)
		}
		if switched {
			continue
		}
		if len(f.pending) > 0 && time.Since(f.lastData) >= f.opts.PartialAfter {
			f.flushPartial()
		}
		if f.stopped() {
			f.flushPartial()
			return nil
		}
		f.idle()
		if !f.wait(ctx) {
			return f.stop(ctx, nil)
		}
	}
}

// stop ends Follow: nil once ctx is done, after delivering a partial last
// line that was really at the end of the file (not cut by a read buffer).
func (f *follower) stop(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if f.atEOF {
		f.flushPartial()
	}
	return nil
}

type follower struct {
	path   string
	opts   Options
	onLine func(string)

	file   *os.File
	info   os.FileInfo // of file, to tell a replacement by os.SameFile
	head   []byte      // the file's first bytes, to tell a rewrite in place
	pos    int64       // bytes read from file
	atEOF  bool        // the last read found the end of the file
	opened bool        // a file was opened before: the next one replaces it
	goneAt time.Time   // when file was first seen deleted; zero while it is not

	buf      []byte
	pending  []byte // the line read so far, without its newline
	skipping bool   // the current line was cut: drop bytes up to its newline
	lastData time.Time
}

// open opens the path; ok is false when it does not exist yet.
func (f *follower) open(skipExisting bool) (bool, error) {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("follow %s: %w", f.path, err)
	}
	info, err := file.Stat()
	if err == nil && info.IsDir() {
		err = errors.New("is a directory")
	}
	if err != nil {
		file.Close()
		return false, fmt.Errorf("follow %s: %w", f.path, err)
	}
	f.file, f.info, f.pos, f.head, f.goneAt = file, info, 0, f.head[:0], time.Time{}
	if f.opts.OnOpen != nil {
		f.opts.OnOpen(info)
	}
	if _, err := f.checkHead(); err != nil {
		f.closeFile()
		return false, err
	}
	if skipExisting {
		if f.pos, err = file.Seek(0, io.SeekEnd); err != nil {
			f.closeFile()
			return false, fmt.Errorf("follow %s: %w", f.path, err)
		}
	}
	return true, nil
}

func (f *follower) closeFile() {
	if f.file != nil {
		f.file.Close()
		f.file = nil
	}
}

// readAll reads the open file to its current end, delivering whole lines.
func (f *follower) readAll(ctx context.Context) error {
	for ctx.Err() == nil {
		n, err := f.file.Read(f.buf)
		if n > 0 {
			f.pos += int64(n)
			f.lastData = time.Now()
			f.atEOF = false
			f.consume(f.buf[:n])
		}
		if err == io.EOF || (n == 0 && err == nil) {
			f.atEOF = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("follow %s: %w", f.path, err)
		}
	}
	return ctx.Err()
}

func (f *follower) consume(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			f.add(b)
			return
		}
		f.add(b[:i])
		if f.skipping {
			f.skipping = false
		} else {
			f.deliver()
		}
		b = b[i+1:]
	}
}

// add appends to the current line, cutting it at MaxLineBytes.
func (f *follower) add(b []byte) {
	if f.skipping {
		return
	}
	room := f.opts.MaxLineBytes - len(f.pending)
	if len(b) <= room {
		f.pending = append(f.pending, b...)
		return
	}
	f.pending = append(f.pending, b[:room]...)
	f.deliver()
	f.skipping = true
	if f.opts.OnLongLine != nil {
		f.opts.OnLongLine(f.opts.MaxLineBytes)
	}
}

func (f *follower) deliver() {
	line := f.pending
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	// A writer without O_APPEND keeps its offset across copytruncate and
	// leaves a hole that reads as NULs.
	line = bytes.TrimLeft(line, "\x00")
	f.onLine(string(line))
	f.pending = f.pending[:0]
}

// flushPartial delivers an unterminated last line.
func (f *follower) flushPartial() {
	if len(f.pending) > 0 && !f.skipping {
		f.deliver()
	}
	f.pending = f.pending[:0]
	f.skipping = false
}

// checkFile looks at the path once the open file was read to its end.
// switched is true when the file was truncated or replaced and the
// follower must read again at once (the new file is opened by Follow).
func (f *follower) checkFile(ctx context.Context) (switched bool, err error) {
	info, err := os.Stat(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Renamed away, or deleted: keep reading the old file, which its
		// writer may still append to, until a new one appears; but not a
		// deleted one that stopped growing, which nothing can reach again.
		if !f.deletedQuiet() {
			return false, nil
		}
		f.flushPartial()
		f.closeFile()
		if f.opts.OnDeleted != nil {
			f.opts.OnDeleted()
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("follow %s: %w", f.path, err)
	case !os.SameFile(info, f.info):
		// Finish the old file: lines written since the last read, then its
		// unterminated tail.
		if err := f.readAll(ctx); err != nil {
			return false, err
		}
		f.flushPartial()
		f.closeFile()
		return true, nil
	case info.Size() < f.pos:
		f.flushPartial()
		if _, err := f.file.Seek(0, io.SeekStart); err != nil {
			return false, fmt.Errorf("follow %s: %w", f.path, err)
		}
		f.pos = 0
		f.reset(ReasonTruncated)
		return true, nil
	}
	return false, nil
}

// deletedQuiet tells whether the open file has no link left and has
// neither grown nor been seen linked for DeletedGrace. Where the link
// count cannot be read the file is kept, as a renamed one is.
func (f *follower) deletedQuiet() bool {
	info, err := f.file.Stat()
	if err != nil {
		return false
	}
	if n, ok := linkCount(info); !ok || n > 0 {
		f.goneAt = time.Time{}
		return false
	}
	now := time.Now()
	if f.goneAt.IsZero() {
		f.goneAt = now
	}
	return now.Sub(f.goneAt) >= f.opts.DeletedGrace && now.Sub(f.lastData) >= f.opts.DeletedGrace
}

// headBytes is how much of the file's start is remembered. Log lines start
// with a time stamp or a process prefix, so a restarted engine that rewrote
// the file in place almost always changes them.
const headBytes = 4096

// checkHead tells whether the file was truncated and written again between
// two polls, past the offset already read: the size check cannot see that,
// but the file's first bytes changed. Then it rewinds to the start. It also
// grows the remembered head while the file is young.
func (f *follower) checkHead() (rewritten bool, err error) {
	var now [headBytes]byte
	n, err := f.file.ReadAt(now[:], 0)
	if err != nil && err != io.EOF {
		return false, fmt.Errorf("follow %s: %w", f.path, err)
	}
	if n >= len(f.head) && bytes.Equal(now[:len(f.head)], f.head) {
		f.head = append(f.head[:0], now[:n]...)
		return false, nil
	}
	if n < len(f.head) && f.pos <= int64(n) {
		// Shrunk below the head but not below what was read: the size
		// check in checkFile handles plain truncation.
		f.head = append(f.head[:0], now[:n]...)
		return false, nil
	}
	f.flushPartial()
	if _, err := f.file.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("follow %s: %w", f.path, err)
	}
	f.pos = 0
	f.head = append(f.head[:0], now[:n]...)
	return true, nil
}

func (f *follower) stopped() bool {
	return f.opts.Stop != nil && f.opts.Stop()
}

func (f *follower) idle() {
	if f.opts.idle != nil {
		f.opts.idle()
	}
}

func (f *follower) reset(reason string) {
	if f.opts.OnReset != nil {
		f.opts.OnReset(reason)
	}
}

func (f *follower) wait(ctx context.Context) bool {
	t := time.NewTimer(f.opts.Poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ReadLines calls fn for every line of a finished file (or any reader),
// without its line ending ("\n" or "\r\n"), like Follow does for a
// growing one. A line longer than maxLine bytes is cut to its first
// maxLine bytes; the rest is skipped without being buffered.
func ReadLines(r io.Reader, maxLine int, fn func(line string)) error {
	br := bufio.NewReaderSize(r, chunkBytes)
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if room := maxLine - len(buf); room > 0 {
			buf = append(buf, chunk[:min(room, len(chunk))]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == nil || len(buf) > 0 {
			fn(trimEOL(buf))
		}
		buf = buf[:0]
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func trimEOL(b []byte) string {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return string(b)
}
