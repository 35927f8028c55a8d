package logsource

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"heft/agent/logfollow"
	"heft/agent/logwrap"
)

// MaxLineBytes bounds one line read from a file, as logfollow's default.
const MaxLineBytes = 1 << 20

// readFile reads a plain file: to its end once, or followed across
// rotation, truncation and re-creation (logfollow) with the wrappers
// taken off.
func (s *Source) readFile(ctx context.Context, h Handler, follow bool) error {
	s.resolved(s.spec.Path, "file")
	u := s.unwrapper(h, logwrap.Options{})
	if !follow {
		s.newRun()
		return readWholeFile(s.spec.Path, u)
	}
	s.newRun()
	return logfollow.Follow(ctx, s.spec.Path, logfollow.Options{
		Poll: s.opts.Poll, DeletedGrace: s.opts.deletedGrace, OnDeleted: s.deleted(s.spec.Path),
		OnReset: func(reason string) {
			u.Flush()
			h.reset(reason)
		},
	}, u.Line)
}

// readWholeFile reads a file to its end through u, decompressing a .gz,
// and flushes u.
func readWholeFile(path string, u *logwrap.Unwrapper) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil {
		return err
	} else if info.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	if err := readLinesFrom(path, f, u.Line); err != nil {
		return err
	}
	u.Flush()
	return nil
}

// readLinesFrom reads the lines of an open file, gunzipping a .gz.
func readLinesFrom(path string, f io.Reader, fn func(string)) error {
	r := f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		defer z.Close()
		r = z
	}
	if err := logfollow.ReadLines(r, MaxLineBytes, fn); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// newestMatch returns the newest regular file matching the glob, and how
// many matched.
func newestMatch(pattern string) (string, time.Time, int, error) {
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return "", time.Time{}, 0, err
	}
	var best string
	var bestTime time.Time
	n := 0
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		n++
		// The newest by modification time; of equal times the last name,
		// as rotated names sort before the live one less often than not.
		if best == "" || info.ModTime().After(bestTime) || (info.ModTime().Equal(bestTime) && p > best) {
			best, bestTime = p, info.ModTime()
		}
	}
	return best, bestTime, n, nil
}

// errNoMatch is returned by a one-shot read of a glob that matches nothing.
var errNoMatch = errors.New("no file matches")

// readGlob reads the newest file the glob matches; following, it looks
// again every Rescan and moves to a newer file when one appears (a
// restarted engine writing a new file), with ReasonNewerFile.
func (s *Source) readGlob(ctx context.Context, h Handler, follow bool) error {
	pattern := s.spec.Path
	current, curTime, n, err := newestMatch(pattern)
	if err != nil {
		return fmt.Errorf("glob %s: %w", pattern, err)
	}
	if !follow {
		if current == "" {
			return fmt.Errorf("glob %s: %w (does the folder exist, and may the agent read it?)", pattern, errNoMatch)
		}
		s.matched(current, n)
		s.newRun()
		return readWholeFile(current, s.unwrapper(h, logwrap.Options{}))
	}
	for current == "" {
		s.resolved("", "glob: waiting for a file matching "+pattern)
		if !sleep(ctx, s.opts.Rescan) {
			return nil
		}
		if current, curTime, n, err = newestMatch(pattern); err != nil {
			return fmt.Errorf("glob %s: %w", pattern, err)
		}
	}
	first := true
	for ctx.Err() == nil {
		s.matched(current, n)
		if !first {
			h.reset(ReasonNewerFile)
		}
		first = false
		s.newRun()
		u := s.unwrapper(h, logwrap.Options{})
		var next string
		lastCheck := time.Now()
		err := logfollow.Follow(ctx, current, logfollow.Options{
			Poll: s.opts.Poll, DeletedGrace: s.opts.deletedGrace, OnDeleted: s.deleted(current),
			OnReset: func(reason string) {
				u.Flush()
				h.reset(reason)
			},
			Stop: func() bool {
				if time.Since(lastCheck) < s.opts.Rescan {
					return false
				}
				lastCheck = time.Now()
				if s.opts.rescanned != nil {
					defer s.opts.rescanned()
				}
				if info, err := os.Stat(current); err == nil {
					curTime = info.ModTime()
				}
				newest, newestTime, m, err := newestMatch(pattern)
				// Only a file written after the one followed was last
				// written takes over: two files written at once do not
				// flap, and an older file never replaces a deleted one.
				if err != nil || newest == "" || newest == current || !newestTime.After(curTime) {
					return false
				}
				next, curTime, n = newest, newestTime, m
				return true
			},
		}, u.Line)
		u.Flush()
		if err != nil {
			return err
		}
		if next == "" {
			return nil // ctx ended
		}
		s.logger.Info("a newer file matches the engine log glob; reading it", "from", current, "to", next)
		current = next
	}
	return nil
}

// matched records the file a glob resolved to.
func (s *Source) matched(path string, n int) {
	s.resolved(path, "glob "+s.spec.Path)
	if n > 1 {
		s.note("%d files match %s; reading the newest, %s", n, s.spec.Path, path)
	}
}

// isNotExist tells a missing path from other errors.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
