package logsource

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
)

// podLog is a scratch /var/log/pods with one container's run spread over
// rotated files the way the kubelet leaves them.
type podLog struct {
	t     *testing.T
	root  string
	dir   string // root/NS_POD_UID/CONTAINER
	lines []string
	parts []string // CRI text of each file, oldest first
}

// newPodLog writes the SGLang DP2 log with pools 24,094 and 2,925, CRI
// wrapped with lines split into 60-byte chunks, as 0.log.<t1>.gz,
// 0.log.<t2> and 0.log. The files are cut between physical lines, so a
// "P" chunk may end one file and its "F" begin the next.
func newPodLog(t *testing.T) *podLog {
	t.Helper()
	root := t.TempDir()
	p := &podLog{t: t, root: root, dir: filepath.Join(root, "inference_sglang-0_6f1c2d3e-aaaa-bbbb-cccc-000000000001", "sglang"),
		lines: fixtureLines(t, "logs/sglang-dp2-uneven.log")}
	phys := strings.SplitAfter(wraptest.CRI(p.lines, t0, 60), "\n")
	// The first file ends inside a split line: its "F" is in the next file.
	a, b := len(phys)/3+1, 2*len(phys)/3+1
	for !strings.Contains(phys[a-1], " stderr P ") && !strings.Contains(phys[a-1], " stdout P ") {
		a++
	}
	p.parts = []string{strings.Join(phys[:a], ""), strings.Join(phys[a:b], ""), strings.Join(phys[b:], "")}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(p.parts[0]))
	zw.Close()
	writeFile(t, filepath.Join(p.dir, "0.log.20260302-101000.gz"), gz.String())
	writeFile(t, filepath.Join(p.dir, "0.log.20260302-101500"), p.parts[1])
	writeFile(t, filepath.Join(p.dir, "0.log"), p.parts[2])
	// Another container of the pod, and another pod, are not read.
	writeFile(t, filepath.Join(root, "inference_sglang-0_6f1c2d3e-aaaa-bbbb-cccc-000000000001", "sidecar", "0.log"), "2026-03-02T10:15:00Z stdout F sidecar\n")
	writeFile(t, filepath.Join(root, "inference_sglang-01_6f1c2d3e-aaaa-bbbb-cccc-000000000002", "sglang", "0.log"), "2026-03-02T10:15:00Z stdout F other pod\n")
	return p
}

// rotate does what the kubelet does: 0.log renamed with a stamp, then the
// runtime writes a new 0.log.
func (p *podLog) rotate(stamp, next string) {
	p.t.Helper()
	live := filepath.Join(p.dir, "0.log")
	if err := os.Rename(live, live+"."+stamp); err != nil {
		p.t.Fatal(err)
	}
	writeFile(p.t, live, next)
}

func (p *podLog) source(o Options) *Source {
	o.PodsRoot = p.root
	src, err := Open("k8s:inference/sglang-0/sglang", fast(o), logger(p.t))
	if err != nil {
		p.t.Fatal(err)
	}
	return src
}

// A Deployment's pod, named by a pattern: the newest matching pod's log.
func TestK8sPodPattern(t *testing.T) {
	p := newPodLog(t)
	older := filepath.Join(p.root, "inference_sglang-7d9f-x2x9z_6f1c2d3e-aaaa-bbbb-cccc-000000000003", "sglang", "0.log")
	writeFile(t, older, wraptest.CRI(fixtureLines(t, "engines/sglang-dp2-even.log"), t0, 0))
	other := filepath.Join(p.root, "inference_sglang-01_6f1c2d3e-aaaa-bbbb-cccc-000000000002", "sglang", "0.log")
	for path, at := range map[string]time.Time{older: t0, other: t0.Add(time.Minute)} {
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	src, err := Open("k8s:inference/sglang-*/sglang", fast(Options{PodsRoot: p.root}), logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); st.Resolved != filepath.Join(p.dir, "0.log") {
		t.Fatalf("status %+v", st)
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 24094, 1, 2925)) {
		t.Fatalf("ranks %v", r)
	}
}

func TestK8sReadAllFindsTheStartOfTheRun(t *testing.T) {
	p := newPodLog(t)
	src := p.source(Options{})
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	got, _ := rec.got()
	if !slices.Equal(got, p.lines) {
		t.Fatalf("lines differ: got %d, want %d", len(got), len(p.lines))
	}
	f, _ := rec.tracker.Facts()
	if !slices.Equal(f.Ranks, ranks(0, 24094, 1, 2925)) || f.DPSize != 2 || !f.Complete {
		t.Fatalf("facts %+v", f)
	}
	st := src.Status()
	if st.Resolved != filepath.Join(p.dir, "0.log") || st.Wrapper != "cri" || len(st.Skipped) != 0 || st.LastError != "" {
		t.Fatalf("status %+v", st)
	}
}

// The kubelet rotates while the rotated files are read, in a one-shot read
// and a follower: nothing is read twice or lost, and the order holds.
func TestK8sRotationMidRead(t *testing.T) {
	extra := wraptest.CRI([]string{"[2026-03-02 10:16:00 DP0] Decode batch, #running-req: 1"}, t0.Add(time.Hour), 0)
	for _, follow := range []bool{false, true} {
		t.Run(map[bool]string{false: "read-all", true: "follow"}[follow], func(t *testing.T) {
			p := newPodLog(t)
			rotated := false
			src := p.source(Options{afterRotated: func(path string) {
				if !rotated && strings.HasSuffix(path, ".gz") {
					rotated = true
					p.rotate("20260302-102000", extra)
				}
			}})
			rec := newRecorder(t, "sglang")
			want := append(slices.Clone(p.lines), "[2026-03-02 10:16:00 DP0] Decode batch, #running-req: 1")
			if follow {
				stop := following(t, src, rec.handler())
				testutil.Eventually(t, "every line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) >= len(want) })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			} else if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
				t.Fatal(err)
			}
			got, resets := rec.got()
			if !rotated || !slices.Equal(got, want) || len(resets) != 0 {
				t.Fatalf("rotated %v, resets %q, lines equal %v (got %d, want %d)", rotated, resets, slices.Equal(got, want), len(got), len(want))
			}
			if r := rec.ranks(); !slices.Equal(r, ranks(0, 24094, 1, 2925)) {
				t.Fatalf("ranks %v", r)
			}
		})
	}
}

// A rotation between the last look at the rotated files and the
// follower's first open: the file renamed away is read before the new one.
func TestK8sRotationBeforeFollowOpens(t *testing.T) {
	p := newPodLog(t)
	next := wraptest.CRI([]string{"after"}, t0.Add(time.Hour), 0)
	src := p.source(Options{beforeFollow: func() { p.rotate("20260302-102000", next) }})
	rec := newRecorder(t, "sglang")
	stop := following(t, src, rec.handler())
	want := append(slices.Clone(p.lines), "after")
	testutil.Eventually(t, "every line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) >= len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, _ := rec.got(); !slices.Equal(got, want) {
		t.Fatalf("got %d lines, want %d; last %q", len(got), len(want), got[len(got)-1])
	}
}

// Following: the kubelet's rotation is the same run (no reset, nothing
// read twice); a restarted container (1.log) and a re-created pod (a new
// UID) are new runs.
func TestK8sFollowRotationRestartAndNewPod(t *testing.T) {
	p := newPodLog(t)
	src := p.source(Options{})
	rec := newRecorder(t, "sglang")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "the first run's pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24094, 1, 2925)) })

	p.rotate("20260302-103000", wraptest.CRI([]string{"[2026-03-02 10:30:00 DP1] Decode batch, #running-req: 3"}, t0.Add(time.Hour), 0))
	testutil.Eventually(t, "the line after the rotation", 10*time.Second, func() bool {
		l, _ := rec.got()
		return len(l) == len(p.lines)+1
	})
	if _, resets := rec.got(); len(resets) != 0 {
		t.Fatalf("a rotation reset the facts: %q", resets)
	}

	// The container restarts: the kubelet starts 1.log.
	restart := fixtureLines(t, "logs/sglang-restart.log")
	writeFile(t, filepath.Join(p.dir, "1.log"), wraptest.CRI(restart, t0.Add(2*time.Hour), 0))
	testutil.Eventually(t, "the restarted run's pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24101, 1, 24088)) })
	if _, resets := rec.got(); !slices.Equal(resets, []string{ReasonRestarted}) {
		t.Fatalf("resets %q", resets)
	}
	if st := src.Status(); st.Resolved != filepath.Join(p.dir, "1.log") || st.Runs != 2 {
		t.Fatalf("status %+v", st)
	}

	// The pod is deleted and created again under its name: a new UID.
	newDir := filepath.Join(p.root, "inference_sglang-0_6f1c2d3e-aaaa-bbbb-cccc-000000000009", "sglang")
	writeFile(t, filepath.Join(newDir, "0.log"), wraptest.CRI(fixtureLines(t, "engines/sglang-dp2-even.log"), t0.Add(3*time.Hour), 0))
	if err := os.Chtimes(filepath.Join(newDir, "0.log"), time.Now().Add(time.Hour), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the new pod's pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 24094, 1, 24037)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); st.Resolved != filepath.Join(newDir, "0.log") || st.Runs != 3 {
		t.Fatalf("status %+v", st)
	}
}

func TestK8sErrors(t *testing.T) {
	p := newPodLog(t)
	tests := []struct {
		spec, root, want string
	}{
		{"k8s:inference/vllm-0/vllm", p.root, "no folder inference_vllm-0_<uid> under"},
		{"k8s:inference/vllm-*/sglang", p.root, "no folder inference_vllm-*_<uid> under"},
		{"k8s:inference/sglang-0/engine", p.root, `pod inference/sglang-0 has no log of container "engine" under ` + p.root + ` (containers with logs: sglang, sidecar)`},
		{"k8s:inference/sglang-0/sglang", filepath.Join(p.root, "absent"), "cannot read the pod logs"},
	}
	for _, tc := range tests {
		src, err := Open(tc.spec, Options{PodsRoot: tc.root}, nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := newRecorder(t, "sglang")
		if err := src.ReadAll(context.Background(), rec.handler()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.spec, err, tc.want)
		}
		if err := src.Follow(context.Background(), rec.handler()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: follow err %v, want %q", tc.spec, err, tc.want)
		}
	}

	// A rotated file that cannot be read is noted; the rest is read.
	if err := os.WriteFile(filepath.Join(p.dir, "0.log.20260302-100000.gz"), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := p.source(Options{})
	rec := newRecorder(t, "sglang")
	if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
		t.Fatal(err)
	}
	if st := src.Status(); len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "0.log.20260302-100000.gz could not be read whole") {
		t.Fatalf("notes %q", st.Notes)
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 24094, 1, 2925)) {
		t.Fatalf("ranks %v", r)
	}
}

// A crash-looping container: every restart is a new run with its own
// unwrapper. Status adds up what every run skipped, while the finished
// unwrappers are let go: memory stays flat however many restarts.
func TestK8sCrashLoopKeepsOneUnwrapper(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "inference_vllm-0_6f1c2d3e-aaaa-bbbb-cccc-000000000001", "vllm")
	run := func(n int) string {
		at := t0.Add(time.Duration(n) * time.Minute).Format(time.RFC3339Nano)
		return fmt.Sprintf("%s stdout F run %d starts\n%s stdout X run %d has a line without its tag\n", at, n, at, n)
	}
	writeFile(t, filepath.Join(dir, "0.log"), run(0))
	var mu sync.Mutex
	var made []weak.Pointer[logwrap.Unwrapper]
	src, err := Open("k8s:inference/vllm-0/vllm", fast(Options{PodsRoot: root, newUnwrapper: func(u *logwrap.Unwrapper) {
		mu.Lock()
		made = append(made, weak.Make(u))
		mu.Unlock()
	}}), logger(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := following(t, src, newRecorder(t, "vllm").handler())
	const restarts = 30
	for n := 1; n <= restarts; n++ {
		testutil.Eventually(t, "the run's lines", 10*time.Second, func() bool { return src.Status().Skipped[logwrap.SkipCRINoTag] == int64(n) })
		writeFile(t, filepath.Join(dir, strconv.Itoa(n)+".log"), run(n))
	}
	testutil.Eventually(t, "the last run's lines", 10*time.Second, func() bool { return src.Status().Runs == restarts+1 && src.Status().Lines == restarts+1 })
	st := src.Status()
	if st.Skipped[logwrap.SkipCRINoTag] != restarts+1 || len(st.Skipped) != 1 || st.Wrapper != "cri" ||
		!strings.Contains(st.LastProblem, "run 30 has a line without its tag") {
		t.Fatalf("status %+v", st)
	}
	runtime.GC()
	mu.Lock()
	defer mu.Unlock()
	live := 0
	for _, w := range made {
		if w.Value() != nil {
			live++
		}
	}
	if len(made) != restarts+1 || live > 1 {
		t.Fatalf("%d unwrappers made, %d still held; want %d made and only the current one held", len(made), live, restarts+1)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
