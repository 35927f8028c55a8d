package logfollow

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/shared/testutil"
)

// run follows path in a goroutine and records lines, resets ("RESET:why")
// and cut lines ("CUT:n") in order.
type run struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error

	mu    sync.Mutex
	got   []string
	idles int
}

func start(t *testing.T, path string, opts Options) *run {
	t.Helper()
	return startWith(t, path, opts, nil)
}

// startWith is start with hooks that record into the run: configure sets
// them before the follower starts.
func startWith(t *testing.T, path string, opts Options, configure func(r *run, o *Options)) *run {
	t.Helper()
	r := &run{t: t, done: make(chan error, 1)}
	if configure != nil {
		configure(r, &opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	if opts.Poll == 0 {
		opts.Poll = 2 * time.Millisecond
	}
	opts.OnReset = func(why string) { r.add("RESET:" + why) }
	opts.OnLongLine = func(n int) { r.add("CUT:" + strings.Repeat("#", min(n, 3))) }
	opts.idle = func() {
		r.mu.Lock()
		r.idles++
		r.mu.Unlock()
	}
	go func() { r.done <- Follow(ctx, path, opts, r.add) }()
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *run) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
}

func (r *run) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// waitFor waits until the recorded events equal want.
func (r *run) waitFor(want ...string) {
	r.t.Helper()
	defer func() {
		if r.t.Failed() {
			r.t.Logf("events = %q", r.lines())
		}
	}()
	testutil.Eventually(r.t, fmt.Sprintf("events %q", want), 10*time.Second, func() bool { return slices.Equal(r.lines(), want) })
}

// settle waits until the follower has twice more found the end of the
// file and gone idle, so everything written before the call was read.
func (r *run) settle() {
	r.t.Helper()
	r.mu.Lock()
	target := r.idles + 2
	r.mu.Unlock()
	testutil.Eventually(r.t, "the follower to go idle twice more", 10*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.idles >= target
	})
}

func (r *run) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // later stops see it too
		return err
	case <-time.After(10 * time.Second):
		r.t.Fatal("Follow did not return after cancel")
		return nil
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestFollowExistingAndGrowth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "a\nb\n\n")
	r := start(t, path, Options{})
	r.waitFor("a", "b", "")
	appendTo(t, path, "c\r\nd\n")
	r.waitFor("a", "b", "", "c", "d")
	if err := r.stop(); err != nil {
		t.Fatalf("Follow returned %v after cancel, want nil", err)
	}
}

func TestFollowFromEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "old 1\nold 2\n")
	r := start(t, path, Options{FromEnd: true})
	r.settle()
	appendTo(t, path, "new\n")
	r.waitFor("new")

	// FromStart wins over FromEnd.
	r2 := start(t, path, Options{FromEnd: true, FromStart: true})
	r2.waitFor("old 1", "old 2", "new")
}

func TestFollowWaitsForTheFile(t *testing.T) {
	for _, fromEnd := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "later.log")
		r := start(t, path, Options{FromEnd: fromEnd})
		r.settle() // polled at least twice with no file
		write(t, path, "first\n")
		// A file that appears later is new content: read whole even with FromEnd.
		r.waitFor("first")
	}
}

func TestFollowPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "done\nhalf a li")
	r := start(t, path, Options{PartialAfter: time.Hour})
	r.waitFor("done")
	r.settle()
	if got := r.lines(); !slices.Equal(got, []string{"done"}) {
		t.Fatalf("an unterminated line was delivered early: %q", got)
	}
	appendTo(t, path, "ne\nnext\n")
	r.waitFor("done", "half a line", "next")
}

func TestFollowPartialLineAfterAWhile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "crashed mid-li")
	r := start(t, path, Options{PartialAfter: 20 * time.Millisecond})
	r.waitFor("crashed mid-li")
	appendTo(t, path, "ne\n")
	r.waitFor("crashed mid-li", "ne")
}

func TestFollowPartialLineAtCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "x\ny")
	r := start(t, path, Options{PartialAfter: time.Hour})
	r.waitFor("x")
	r.settle()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.lines(); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("lines = %q, want the partial line delivered at cancel", got)
	}
}

func TestFollowRenameRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "engine.log")
	write(t, path, "a\n")
	r := start(t, path, Options{PartialAfter: time.Hour})
	r.waitFor("a")
	// The writer adds to the old file just before the rotation; those
	// lines, and its unterminated tail, come before the new file's.
	appendTo(t, path, "b\ntail")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	write(t, path, "c\n")
	r.waitFor("a", "b", "tail", "RESET:replaced", "c")
	appendTo(t, path, "d\n")
	r.waitFor("a", "b", "tail", "RESET:replaced", "c", "d")
}

func TestFollowCopyTruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "line one\nline two\nline three\n")
	r := start(t, path, Options{})
	r.waitFor("line one", "line two", "line three")
	// logrotate copytruncate: the file is cut to zero in place and the
	// writer goes on appending.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, "n1\n")
	r.waitFor("line one", "line two", "line three", "RESET:truncated", "n1")
}

func TestFollowRewriteInPlace(t *testing.T) {
	// A restarted engine writing with `>` truncates the file and may write
	// more than was there before between two polls: the size never looks
	// smaller, but the first bytes changed.
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "[2026-11-30 10:00:00] server_args=ServerArgs(dp_size=2)\n")
	r := start(t, path, Options{Poll: 200 * time.Millisecond})
	r.waitFor("[2026-11-30 10:00:00] server_args=ServerArgs(dp_size=2)")
	write(t, path, "[2026-11-30 10:05:00] server_args=ServerArgs(dp_size=4)\n[2026-11-30 10:05:01 DP0] ready\n")
	r.waitFor("[2026-11-30 10:00:00] server_args=ServerArgs(dp_size=2)", "RESET:truncated",
		"[2026-11-30 10:05:00] server_args=ServerArgs(dp_size=4)", "[2026-11-30 10:05:01 DP0] ready")
}

func TestFollowDeleteAndRecreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "a\n")
	r := start(t, path, Options{})
	r.waitFor("a")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	r.settle() // polled with the file gone
	write(t, path, "b\n")
	r.waitFor("a", "RESET:replaced", "b")
}

// A deleted file (no name left) that its writer still appends to is read
// on; once it stops growing for DeletedGrace it is closed, so it holds no
// disk space, OnDeleted says so, and a new file at the path is read.
func TestFollowClosesADeletedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "a\n")
	r := startWith(t, path, Options{DeletedGrace: 300 * time.Millisecond}, func(r *run, o *Options) {
		o.OnDeleted = func() { r.add("DELETED") }
	})
	r.waitFor("a")
	engine, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	// The engine goes on writing for longer than the grace.
	want := []string{"a"}
	for i := range 10 {
		line := fmt.Sprintf("b%d", i)
		if _, err := engine.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
		want = append(want, line)
		r.waitFor(want...)
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := engine.WriteString("tail"); err != nil {
		t.Fatal(err)
	}
	engine.Close()
	r.waitFor(append(want, "tail", "DELETED")...)
	if held := testutil.OpenDeleted(t, path); held != 0 {
		t.Fatalf("%d descriptors still hold the deleted file", held)
	}
	write(t, path, "c\n")
	r.waitFor(append(want, "tail", "DELETED", "RESET:replaced", "c")...)
}

func TestFollowLongLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	huge := strings.Repeat("x", 3*chunkBytes+17) // spans several reads
	write(t, path, "short\n"+strings.Repeat("y", 100)+"\n"+strings.Repeat("z", 101)+"\n"+huge+"\nafter\n")
	r := start(t, path, Options{MaxLineBytes: 100})
	r.waitFor("short", strings.Repeat("y", 100), strings.Repeat("z", 100), "CUT:###", strings.Repeat("x", 100), "CUT:###", "after")
}

func TestFollowStripsWriterHoles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "engine.log")
	write(t, path, "\x00\x00\x00resumed\n")
	r := start(t, path, Options{})
	r.waitFor("resumed")
}

func TestFollowErrors(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Follow(ctx, dir, Options{}, func(string) {}); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("following a directory: err = %v", err)
	}

	// A missing file and an ended context: nil, not an error.
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if err := Follow(done, filepath.Join(dir, "missing.log"), Options{}, func(string) {}); err != nil {
		t.Errorf("err = %v, want nil", err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{}.withDefaults()
	if o.Poll != 250*time.Millisecond || o.MaxLineBytes != 1<<20 || o.PartialAfter != 2*time.Second || o.DeletedGrace != 10*time.Second || o.FromEnd {
		t.Errorf("defaults = %+v", o)
	}
}

// OnOpen sees every file at the path before its lines; Stop ends Follow
// once the file was read to its end, delivering its unterminated tail.
func TestOnOpenAndStop(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	if err := os.WriteFile(path, []byte("a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	stop := false
	r := startWith(t, path, Options{}, func(r *run, o *Options) {
		o.OnOpen = func(info os.FileInfo) { r.add("OPEN:" + info.Name()) }
		o.Stop = func() bool {
			mu.Lock()
			defer mu.Unlock()
			return stop
		}
	})
	r.waitFor("OPEN:x.log", "a")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("b\ntail"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitFor("OPEN:x.log", "a", "OPEN:x.log", "RESET:"+ReasonReplaced, "b")
	mu.Lock()
	stop = true
	mu.Unlock()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a deadline, not a speed
		t.Fatal("Follow did not stop")
	}
	if got := r.lines(); !slices.Equal(got, []string{"OPEN:x.log", "a", "OPEN:x.log", "RESET:" + ReasonReplaced, "b", "tail"}) {
		t.Fatalf("events %q", got)
	}
	r.done <- nil // for the cleanup's stop

	// Stop is asked while the file does not exist, too.
	r2 := start(t, filepath.Join(t.TempDir(), "absent.log"), Options{Stop: func() bool { return true }})
	select {
	case err := <-r2.done:
		if err != nil {
			t.Fatal(err)
		}
		r2.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not stop without a file")
	}
}

func TestReadLinesCutsLongLines(t *testing.T) {
	long := strings.Repeat("x", 300_000)
	in := "a\r\n" + long + "\nb\n\nlast"
	var got []string
	if err := ReadLines(strings.NewReader(in), 1000, func(l string) { got = append(got, l) }); err != nil {
		t.Fatal(err)
	}
	want := []string{"a", long[:1000], "b", "", "last"}
	if !slices.Equal(got, want) {
		t.Fatalf("lines = %d %q..., want %d", len(got), got[0], len(want))
	}
}
