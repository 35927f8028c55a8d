package logsource

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Spec
	}{
		{"/var/log/vllm/server.log", Spec{Kind: KindFile, Path: "/var/log/vllm/server.log"}},
		{"  logs/engine.log ", Spec{Kind: KindFile, Path: "logs/engine.log"}},
		{"file:/x/a:b.log", Spec{Kind: KindFile, Path: "/x/a:b.log"}},
		{"/var/log/a:b.log", Spec{Kind: KindFile, Path: "/var/log/a:b.log"}},
		{"./journal:vllm", Spec{Kind: KindFile, Path: "./journal:vllm"}},
		{"/var/log/vllm/*.log", Spec{Kind: KindGlob, Path: "/var/log/vllm/*.log"}},
		{"/var/log/vllm/server-[0-9].log", Spec{Kind: KindGlob, Path: "/var/log/vllm/server-[0-9].log"}},
		{"journald:vllm", Spec{Kind: KindJournald, Unit: "vllm.service"}},
		{"journald:vllm@2.service", Spec{Kind: KindJournald, Unit: "vllm@2.service"}},
		{"journald:engines.scope", Spec{Kind: KindJournald, Unit: "engines.scope"}},
		{"docker:vllm", Spec{Kind: KindDocker, Container: "vllm"}},
		{"docker:/sglang_1", Spec{Kind: KindDocker, Container: "sglang_1"}},
		{"docker:3f2a9c", Spec{Kind: KindDocker, Container: "3f2a9c"}},
		{"k8s:inference/vllm-0/vllm", Spec{Kind: KindK8s, Namespace: "inference", Pod: "vllm-0", Container: "vllm"}},
		{"kubernetes:default/sglang.a-1/engine", Spec{Kind: KindK8s, Namespace: "default", Pod: "sglang.a-1", Container: "engine"}},
		{"k8s:inference/vllm-*/vllm", Spec{Kind: KindK8s, Namespace: "inference", Pod: "vllm-*", Container: "vllm"}},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(%q).String() = %q does not parse back: %+v %v", tc.in, got.String(), again, err)
		}
	}
	bad := []struct{ in, why string }{
		{"", "empty"},
		{"journald:", "needs a unit"},
		{"journald:vllm server", "not a systemd unit name"},
		{"docker:", "needs a container"},
		{"docker:my container", "not a Docker container name"},
		{"k8s:default/vllm-0", "NAMESPACE/POD/CONTAINER"},
		{"k8s:default/vllm-0/vllm/extra", "NAMESPACE/POD/CONTAINER"},
		{"k8s:Default/vllm-0/vllm", `namespace "Default"`},
		{"k8s:default/vllm_0/vllm", `pod "vllm_0"`},
		{"k8s:default/vllm-[/vllm", `pod pattern "vllm-["`},
		{"k8s:default/vllm_*/vllm", `pod pattern "vllm_*"`},
		{"k8s:default/vllm-0/", `container ""`},
		{"journal:vllm", `unknown kind "journal:"`},
		{"kubectl:x", `unknown kind "kubectl:"`},
		{"/var/log/[a.log", "glob"},
		{"/var/log/*/server.log", "only the file name"},
		{"file:", "needs a path"},
	}
	for _, tc := range bad {
		_, err := Parse(tc.in)
		if !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("Parse(%q) err = %v, want one about %q", tc.in, err, tc.why)
		}
	}
}

// recorder is a Handler that keeps lines and resets, and feeds a tracker.
type recorder struct {
	mu      sync.Mutex
	lines   []string
	resets  []string
	tracker *enginelog.Tracker
}

func newRecorder(t *testing.T, kind string) *recorder {
	t.Helper()
	g, err := engine.LogGrammar(kind)
	if err != nil {
		t.Fatal(err)
	}
	return &recorder{tracker: enginelog.NewTracker(g)}
}

func (r *recorder) handler() Handler {
	return Handler{
		Line: func(l string) {
			r.mu.Lock()
			r.lines = append(r.lines, l)
			r.mu.Unlock()
			r.tracker.Feed(l)
		},
		Reset: func(reason string) {
			r.mu.Lock()
			r.resets = append(r.resets, reason)
			r.mu.Unlock()
			r.tracker.Reset()
		},
	}
}

func (r *recorder) got() ([]string, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines), slices.Clone(r.resets)
}

func (r *recorder) ranks() []wire.Rank {
	f, _ := r.tracker.Facts()
	return f.Ranks
}

func ranks(pairs ...int64) []wire.Rank {
	var out []wire.Rank
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, wire.Rank{DPRank: int(pairs[i]), KVTokens: pairs[i+1]})
	}
	return out
}

// following runs src.Follow in a goroutine; stop ends it and returns its
// error.
func following(t *testing.T, src *Source, h Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Follow(ctx, h) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Follow did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// fixtureLines returns a fixture's lines.
func fixtureLines(t *testing.T, rel string) []string {
	t.Helper()
	return strings.Split(strings.TrimSuffix(string(testutil.ReadTestdata(t, rel)), "\n"), "\n")
}

var t0 = time.Date(2026, 3, 2, 10, 15, 0, 0, time.UTC)

// fast are options for tests: short polls and rescans.
func fast(o Options) Options {
	o.Poll, o.Rescan = 5*time.Millisecond, 20*time.Millisecond
	return o
}

func logger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFileReadAllUnwraps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	writeFile(t, path, wraptest.CRI(fixtureLines(t, "logs/sglang-dp2-uneven.log"), t0, 100))
	src, err := Open(path, fast(Options{}), logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	if got := rec.ranks(); !slices.Equal(got, ranks(0, 24094, 1, 2925)) {
		t.Fatalf("ranks %v", got)
	}
	st := src.Status()
	if st.Kind != KindFile || st.Resolved != path || st.Wrapper != "cri" || st.Lines != int64(len(fixtureLines(t, "logs/sglang-dp2-uneven.log"))) || st.LastError != "" {
		t.Fatalf("status %+v", st)
	}

	for _, tc := range []struct{ path, want string }{
		{filepath.Join(t.TempDir(), "absent.log"), "no such file"},
		{t.TempDir(), "is a directory"},
	} {
		src, _ := Open(tc.path, Options{}, nil)
		err := src.ReadAll(context.Background(), rec.handler())
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(src.Status().LastError, tc.want) {
			t.Errorf("%s: err %v, status %+v", tc.path, err, src.Status())
		}
	}
}

func TestFileFollowUnwrapsAcrossRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "engine.log")
	lines := fixtureLines(t, "engines/vllm-dp2.log")
	writeFile(t, path, wraptest.DockerJSON(lines[:10], t0, 16<<10))
	src, _ := Open(path, fast(Options{}), logger(t))
	rec := newRecorder(t, "vllm")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "the first 10 lines", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == 10 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, wraptest.DockerJSON(lines[10:], t0, 16<<10))
	testutil.Eventually(t, "every line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(lines) })
	got, resets := rec.got()
	if !slices.Equal(got, lines) || !slices.Equal(resets, []string{"replaced"}) {
		t.Fatalf("lines equal %v, resets %q", slices.Equal(got, lines), resets)
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 373696, 1, 373552)) {
		t.Fatalf("ranks %v", r)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); st.Wrapper != "docker-json" {
		t.Fatalf("status %+v", st)
	}
}

// A log file deleted while nothing writes it: the source closes it (no
// descriptor keeps it on disk), says so in Status, keeps what the log
// told (the engine may still run), and reads a new file at the path.
func TestFileFollowClosesADeletedLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	lines := fixtureLines(t, "engines/vllm-dp2.log")
	writeFile(t, path, strings.Join(lines, "\n")+"\n")
	o := fast(Options{})
	o.deletedGrace = 50 * time.Millisecond
	src, _ := Open(path, o, logger(t))
	rec := newRecorder(t, "vllm")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "every line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(lines) })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the deletion in the status", 10*time.Second, func() bool {
		return strings.Contains(src.Status().LastError, path+" was deleted")
	})
	if n := testutil.OpenDeleted(t, path); n != 0 {
		t.Fatalf("%d descriptors still hold the deleted log", n)
	}
	if _, resets := rec.got(); len(resets) != 0 || !slices.Equal(rec.ranks(), ranks(0, 373696, 1, 373552)) {
		t.Fatalf("resets %q, ranks %v: the deletion alone must not forget the engine's facts", resets, rec.ranks())
	}
	writeFile(t, path, "(APIServer pid=1) INFO 03-02 10:20:00 [api_server.py:1] vLLM API server version 0.11.0\n")
	testutil.Eventually(t, "the new file's line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(lines)+1 })
	if _, resets := rec.got(); !slices.Equal(resets, []string{"replaced"}) {
		t.Fatalf("resets %q", resets)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); st.Resolved != path || !st.LastLineAt.After(st.LastErrorAt) {
		t.Fatalf("status %+v: want the file read again after the deletion", st)
	}
}

func TestGlobNewestAndTakeover(t *testing.T) {
	dir := t.TempDir()
	older, newer := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	writeFile(t, older, strings.Join(fixtureLines(t, "engines/sglang-dp2-even.log"), "\n")+"\n")
	writeFile(t, newer, strings.Join(fixtureLines(t, "logs/sglang-dp2-uneven.log"), "\n")+"\n")
	writeFile(t, filepath.Join(dir, "other.txt"), "not matched\n")
	if err := os.Chtimes(older, t0, t0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(newer, t0.Add(time.Minute), t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	glob := filepath.Join(dir, "*.log")

	src, _ := Open(glob, fast(Options{}), logger(t))
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 24094, 1, 2925)) {
		t.Fatalf("one-shot read the wrong file: %v", r)
	}
	st := src.Status()
	if st.Kind != KindGlob || st.Resolved != newer || len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "2 files match") {
		t.Fatalf("status %+v", st)
	}

	// Following: a file newer than the one read takes over.
	var rescans atomic.Int64
	src, _ = Open(glob, fast(Options{rescanned: func() { rescans.Add(1) }}), logger(t))
	rec = newRecorder(t, "sglang")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "the uneven pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24094, 1, 2925)) })
	newest := filepath.Join(dir, "c.log")
	writeFile(t, newest, strings.Join(fixtureLines(t, "logs/sglang-restart.log"), "\n")+"\n")
	if err := os.Chtimes(newest, time.Now().Add(time.Hour), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the newer file's pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24101, 1, 24088)) })
	if _, resets := rec.got(); !slices.Equal(resets, []string{ReasonNewerFile}) {
		t.Fatalf("resets %q", resets)
	}
	// The followed file is deleted: an older match never replaces it.
	if err := os.Remove(newest); err != nil {
		t.Fatal(err)
	}
	seen := rescans.Load()
	testutil.Eventually(t, "three looks at the glob", 10*time.Second, func() bool { return rescans.Load() >= seen+3 })
	if _, resets := rec.got(); len(resets) != 1 || !slices.Equal(rec.ranks(), ranks(0, 24101, 1, 24088)) {
		t.Fatalf("after the delete: resets %q, ranks %v", resets, rec.ranks())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); st.Resolved != newest || st.Runs != 2 {
		t.Fatalf("status %+v", st)
	}

	// Nothing matches: a one-shot read says so; a follower waits.
	empty, _ := Open(filepath.Join(t.TempDir(), "*.log"), fast(Options{}), logger(t))
	if err := empty.ReadAll(context.Background(), rec.handler()); !errors.Is(err, errNoMatch) {
		t.Fatalf("err %v", err)
	}
	stop = following(t, empty, rec.handler())
	testutil.Eventually(t, "the follower to wait", 10*time.Second, func() bool {
		return strings.Contains(empty.Status().Via, "waiting for a file matching")
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
