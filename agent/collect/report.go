package collect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"heft/agent/logsource"
	"heft/agent/status"
	"heft/shared/wire"
)

// Reasons an engine or its log is failing, as the status board says.
const (
	ReasonUnreachable = "unreachable" // nothing answers at the engine's URL
	ReasonBadAnswer   = "bad_answer"  // the engine answers, not as its kind should
	ReasonMissing     = "missing"     // the log file (or any match of its glob) does not exist
	ReasonUnreadable  = "unreadable"  // the log exists and cannot be read
)

// reportEngine puts one full read of an engine on the board: a failing
// engine once, and once again when it can be read.
func reportEngine(rep *status.Reporter, e wire.Engine) {
	if e.Error == "" {
		rep.OK(e.URL, "engine readable again")
		return
	}
	f := status.Failure{Reason: ReasonBadAnswer, Msg: "engine cannot be read", Err: e.Error}
	// The engine package says "engine unreachable" when nothing answered.
	if strings.Contains(e.Error, "engine unreachable") {
		f.Reason, f.Msg = ReasonUnreachable, "engine unreachable"
	}
	rep.Fail(e.URL, f)
}

// LogLines returns how many lines each followed engine log has given, by
// engine URL (its source's count); engines whose log is not followed are
// left out.
func (c *Collector) LogLines() map[string]int64 {
	out := map[string]int64{}
	for _, st := range c.engines {
		if st.watch != nil {
			out[st.client.URL()] = st.src.Status().Lines
		}
	}
	return out
}

// logCheckEvery is how often an engine's log is looked at for the board.
const logCheckEvery = 5 * time.Second

// logWatch tells the board whether an engine's log can be read. The
// follower waits in silence for a file that does not exist yet, so the
// watch looks for the file itself; a follower that fails (no permission,
// a folder, a unit that does not exist) tells it too, and that failure
// stands until a follower has run longer than one check without failing.
type logWatch struct {
	spec   string
	rep    *status.Reporter
	every  time.Duration
	checks atomic.Int64 // checks made, for tests

	mu          sync.Mutex
	followErr   error
	followSince time.Time // when the running follower started; zero while none runs
}

func newLogWatch(spec string, rep *status.Reporter) *logWatch {
	return &logWatch{spec: spec, rep: rep, every: logCheckEvery}
}

// started notes that a follower (re)started.
func (w *logWatch) started() {
	w.mu.Lock()
	w.followSince = time.Now()
	w.mu.Unlock()
}

// failed notes that the follower returned err, and says so at once.
func (w *logWatch) failed(err error) {
	w.mu.Lock()
	w.followErr, w.followSince = err, time.Time{}
	w.mu.Unlock()
	w.check()
}

// run checks the log every w.every until ctx ends.
func (w *logWatch) run(ctx context.Context) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		w.check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *logWatch) check() {
	defer w.checks.Add(1)
	if f, bad := checkLog(w.spec); bad {
		w.rep.Fail(w.spec, f)
		return
	}
	w.mu.Lock()
	err := w.followErr
	if err != nil && !w.followSince.IsZero() && time.Since(w.followSince) > w.every {
		err, w.followErr = nil, nil // the follower has run cleanly since
	}
	w.mu.Unlock()
	if err != nil {
		w.rep.Fail(w.spec, status.Failure{Reason: ReasonUnreadable, Msg: "engine log unreadable; retrying", Err: err.Error()})
		return
	}
	w.rep.OK(w.spec, "engine log readable again")
}

// checkLog looks at a file or glob log: missing, or there and not
// readable. Other sources (journald, docker, k8s) say what is wrong
// through their follower's errors.
func checkLog(spec string) (status.Failure, bool) {
	s, err := logsource.Parse(spec)
	if err != nil {
		return status.Failure{Reason: ReasonUnreadable, Msg: "engine log cannot be read", Err: err.Error()}, true
	}
	path := s.Path
	switch s.Kind {
	case logsource.KindFile:
	case logsource.KindGlob:
		matches, _ := filepath.Glob(s.Path)
		if len(matches) == 0 {
			return status.Failure{Reason: ReasonMissing, Msg: "engine log missing; it is read once it appears",
				Err: fmt.Sprintf("no file matches %s", s.Path)}, true
		}
		path = matches[len(matches)-1]
	default:
		return status.Failure{}, false
	}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return status.Failure{Reason: ReasonMissing, Msg: "engine log missing; it is read once it appears", Err: err.Error(),
			Args: []any{"hint", "check the path, and that the engine writes its output there"}}, true
	case err != nil:
		return status.Failure{Reason: ReasonUnreadable, Msg: "engine log unreadable; retrying", Err: err.Error()}, true
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.IsDir() {
		return status.Failure{Reason: ReasonUnreadable, Msg: "engine log unreadable; retrying", Err: path + " is a directory"}, true
	}
	return status.Failure{}, false
}
