package collect

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/status"
	"heft/shared/testutil"
)

// reporting is a collector whose board and log the test reads.
type reporting struct {
	c     *Collector
	board *status.Board
	log   *testutil.SyncBuffer
}

func newReporting(t *testing.T, engines ...engine.Config) *reporting {
	t.Helper()
	r := &reporting{board: status.New(), log: &testutil.SyncBuffer{}}
	logger := hclog.New(&hclog.LoggerOptions{Name: "heft-agent", Output: r.log, Level: hclog.Info, DisableTime: true})
	c, err := New(Config{Node: "n", Engines: engines, Status: r.board}, &fakeGPUs{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	for _, st := range c.engines {
		if st.watch != nil {
			st.watch.every = 10 * time.Millisecond
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", r.log.String())
		}
	})
	return r
}

func (r *reporting) count(s string) int { return strings.Count(r.log.String(), s) }

// An engine that goes down, answers nonsense and comes back is three
// lines, however many polls it took.
func TestEngineFailuresAreLoggedOncePerChange(t *testing.T) {
	fixture := startEngine(t, "vllm")
	var mode atomic.Value
	mode.Store("ok")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load() {
		case "down": // drop the connection: nothing answers
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		case "html":
			w.Write([]byte("<html><body>login</body></html>"))
		default:
			resp, err := http.Get(fixture.URL + r.URL.Path)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			defer resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
		}
	}))
	t.Cleanup(srv.Close)
	r := newReporting(t, engine.Config{Kind: "vllm", URL: srv.URL})
	polls := func(n int) {
		for range n {
			r.c.Snapshot(t.Context())
		}
	}
	polls(3)
	mode.Store("down")
	polls(5)
	if it, _ := r.board.Get(status.AreaEngine, srv.URL); it.OK || it.Reason != ReasonUnreachable {
		t.Errorf("board: %+v, want unreachable", it)
	}
	mode.Store("html")
	polls(5)
	mode.Store("ok")
	polls(3)

	for _, tc := range []struct {
		line string
		want int
	}{
		{"[WARN]  heft-agent.collect: engine unreachable: url=" + srv.URL + " reason=unreachable", 1},
		{"[WARN]  heft-agent.collect: engine cannot be read: url=" + srv.URL + " reason=bad_answer error=\"GET /v1/models answered HTML", 1},
		{"[INFO]  heft-agent.collect: engine readable again: url=" + srv.URL, 1},
	} {
		if n := r.count(tc.line); n != tc.want {
			t.Errorf("%d lines %q, want %d", n, tc.line, tc.want)
		}
	}
	if it, _ := r.board.Get(status.AreaEngine, srv.URL); !it.OK {
		t.Errorf("board: %+v, want ok", it)
	}
}

// waitChecks waits until the log watch made n more checks.
func (r *reporting) waitChecks(t *testing.T, n int64) {
	t.Helper()
	w := r.c.engines[0].watch
	from := w.checks.Load()
	testutil.Eventually(t, "log checks", 15*time.Second, func() bool { return w.checks.Load() >= from+n })
}

// A missing log, which the follower waits for in silence, is one
// warning; its appearance is one info line.
func TestMissingLogIsOneWarning(t *testing.T) {
	srv := startEngine(t, "sglang")
	logPath := filepath.Join(t.TempDir(), "sglang.log")
	r := newReporting(t, engine.Config{Kind: "sglang", URL: srv.URL, Log: logPath})
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); r.c.Wait() }()
	r.c.Start(ctx)
	r.waitChecks(t, 5)
	want := "[WARN]  heft-agent.collect: engine log missing; it is read once it appears: log=" + logPath + " reason=missing"
	if n := r.count(want); n != 1 {
		t.Fatalf("%d lines %q, want 1", n, want)
	}
	if !strings.Contains(r.log.String(), "no such file or directory") {
		t.Error("the warning does not say why")
	}

	if err := os.WriteFile(logPath, testutil.ReadTestdata(t, "engines/sglang-dp2-even.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.waitChecks(t, 3)
	if n := r.count("[INFO]  heft-agent.collect: engine log readable again: log=" + logPath); n != 1 {
		t.Errorf("%d recovery lines, want 1", n)
	}
	if n := r.count("engine log missing"); n != 1 {
		t.Errorf("%d missing lines in all, want 1", n)
	}
	if it, _ := r.board.Get(status.AreaLog, logPath); !it.OK {
		t.Errorf("board: %+v", it)
	}
	lines := int64(strings.Count(string(testutil.ReadTestdata(t, "engines/sglang-dp2-even.log")), "\n"))
	testutil.Eventually(t, "every line counted", 15*time.Second, func() bool { return r.c.LogLines()[srv.URL] == lines })
}

// A log the follower cannot read (here a folder) is one warning, though
// both the follower and the check see it, again and again.
func TestUnreadableLogIsOneWarning(t *testing.T) {
	srv := startEngine(t, "vllm")
	dir := t.TempDir()
	r := newReporting(t, engine.Config{Kind: "vllm", URL: srv.URL, Log: dir})
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); r.c.Wait() }()
	r.c.Start(ctx)
	r.waitChecks(t, 10)
	if n := r.count("engine log unreadable; retrying: log=" + dir + " reason=unreadable"); n != 1 {
		t.Errorf("%d lines about the unreadable log, want 1", n)
	}
	if it, _ := r.board.Get(status.AreaLog, dir); it.Reason != ReasonUnreadable || !strings.Contains(it.Error, "directory") {
		t.Errorf("board: %+v", it)
	}
}

func TestCheckLogGlob(t *testing.T) {
	dir := t.TempDir()
	f, bad := checkLog(filepath.Join(dir, "vllm-*.log"))
	if !bad || f.Reason != ReasonMissing || !strings.Contains(f.Err, "no file matches") {
		t.Errorf("no match: %+v", f)
	}
	if err := os.WriteFile(filepath.Join(dir, "vllm-1.log"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if f, bad := checkLog(filepath.Join(dir, "vllm-*.log")); bad {
		t.Errorf("a match: %+v", f)
	}
	if _, bad := checkLog("journald:vllm"); bad {
		t.Error("a journald source is judged by its follower, not by a file check")
	}
}
