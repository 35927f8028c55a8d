package collect

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/agent/logsource"
	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
	"heft/shared/health"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// t0 stamps the wrapped test logs.
var t0 = time.Date(2025, 12, 11, 9, 13, 58, 0, time.UTC)

// fastLogs read files and look for newer ones quickly, for tests.
func fastLogs(o logsource.Options) logsource.Options {
	o.Poll, o.Rescan = 20*time.Millisecond, 50*time.Millisecond
	return o
}

func fixtureLines(t *testing.T, rel string) []string {
	t.Helper()
	return strings.Split(strings.TrimRight(string(testutil.ReadTestdata(t, rel)), "\n"), "\n")
}

func writeLog(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func appendLog(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
}

// follow starts a collector over one engine and its log, following until
// the test ends.
func follow(t *testing.T, kind, url, log string, opts logsource.Options) *Collector {
	t.Helper()
	c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: kind, URL: url, Log: log}}, LogOptions: fastLogs(opts)},
		&fakeGPUs{}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() { cancel(); c.Wait() })
	return c
}

var starved = []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373552}, {DPRank: 2, KVTokens: 373600}, {DPRank: 3, KVTokens: 46704}}

// A vLLM DP4 engine in a Kubernetes pod: its log, CRI-wrapped with split
// lines under a scratch /var/log/pods, gives the same pools as the raw
// log; while rank 3 has printed none the set says so and is not called
// even, and the pod log's kubelet rotation changes nothing.
func TestFollowsPodLog(t *testing.T) {
	srv := startEngine(t, "vllm")
	root := t.TempDir()
	live := filepath.Join(root, "inference_vllm-0_5f1c0000-1111-2222-3333-444444444444", "vllm", "0.log")
	lines := fixtureLines(t, "logs/vllm-dp4-starved.log")
	cut := 0
	for i, l := range lines {
		if strings.Contains(l, "EngineCore_DP3") && strings.Contains(l, "GPU KV cache size") {
			cut = i
		}
	}
	writeLog(t, live, wraptest.CRI(lines[:cut], t0, 100))
	c := follow(t, "vllm", srv.URL, "k8s:inference/vllm-0/vllm", logsource.Options{PodsRoot: root})

	var e wire.Engine
	testutil.Eventually(t, "three of four pools", 15*time.Second, func() bool {
		e = c.Snapshot(t.Context()).Engines[0]
		return len(e.Ranks) == 3
	})
	if e.ExpectedRanks != 4 || e.Complete == nil || *e.Complete || !reflect.DeepEqual(e.MissingRanks, []int{3}) {
		t.Fatalf("expected %d complete %v missing %v, want rank 3 of 4 missing", e.ExpectedRanks, e.Complete, e.MissingRanks)
	}
	if l := e.LogSource; l == nil || l.Spec != "k8s:inference/vllm-0/vllm" || l.Resolved != live || l.Wrapper != logwrap.CRI || l.Error != "" || l.Lines == 0 {
		t.Fatalf("log source %+v", e.LogSource)
	}
	fs := health.PoolFindings(e, health.DefaultThresholds())
	if len(fs) != 1 || fs[0].Code != wire.CodePoolsIncomplete {
		t.Fatalf("findings %+v, want pools_incomplete alone", fs)
	}
	if _, ok := health.EnginePoolRatio(e); ok {
		t.Fatal("a ratio over an incomplete set")
	}

	// The kubelet rotates 0.log; rank 3's pool line is in the new file,
	// its "P" chunks split across the two.
	rest := wraptest.CRI(lines[cut:], t0.Add(time.Minute), 100)
	if err := os.Rename(live, live+".20251211-091440"); err != nil {
		t.Fatal(err)
	}
	writeLog(t, live, rest)
	defer func() {
		if t.Failed() {
			t.Logf("last snapshot: ranks %+v, log %+v, status %+v", e.Ranks, e.LogSource, c.LogStatus())
		}
	}()
	testutil.Eventually(t, "the fourth pool, from the rotated-to file", 15*time.Second, func() bool {
		e = c.Snapshot(t.Context()).Engines[0]
		return reflect.DeepEqual(e.Ranks, starved)
	})
	if e.ExpectedRanks != 4 || e.Complete == nil || !*e.Complete || e.MissingRanks != nil {
		t.Fatalf("expected %d complete %v missing %v", e.ExpectedRanks, e.Complete, e.MissingRanks)
	}
	if f := health.Pools(e.Ranks, health.DefaultThresholds()); f == nil || f.Severity != wire.SeverityCritical || !strings.Contains(f.Message, "rank 3 only 46,704") {
		t.Fatalf("imbalance: %+v", f)
	}
}

// Bad input in a followed log, and sources that cannot be read: each is
// said in the log source's status (what inspect shows), never stops the
// collector, and never changes pools already read.
func TestBadLogInput(t *testing.T) {
	good := fixtureLines(t, "logs/sglang-dp2-uneven.log")
	want := []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	// A pool line that would change rank 1 if it were read as the
	// engine's: every bad input below carries it.
	tiny := "[2026-03-02 10:15:30 DP1 TP0] max_total_num_tokens=7, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=4096, context_len=40960"
	stamp := "2026-03-02T10:16:00.000000000Z"
	for _, tc := range []struct {
		name      string
		base, bad string
		skipped   string // the reason the status must count
	}{
		{"truncated docker json objects", wraptest.DockerJSON(good, t0, 0),
			`{"log":"` + tiny + `\n","stream":"stderr","ti` + "\n" + `{"log":"` + tiny + "\n", logwrap.SkipBadJSON},
		{"a cri line without a tag", wraptest.CRI(good, t0, 100), stamp + " stderr " + tiny + "\n", logwrap.SkipCRINoTag},
		{"binary garbage between lines", wraptest.CRI(good, t0, 100),
			"\x00\x01\x02\xff\xfe" + tiny + "\x00\x00\n\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\n", logwrap.SkipBinary},
		{"a P chunk that never ends", wraptest.CRI(good, t0, 100),
			strings.Repeat(stamp+" stderr P "+strings.Repeat("█", 300)+"\n", 300), logwrap.SkipOverlong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startEngine(t, "vllm") // serves no pools of its own
			path := filepath.Join(t.TempDir(), "sglang.log")
			writeLog(t, path, tc.base)
			c := follow(t, "sglang", srv.URL, path, logsource.Options{})
			testutil.Eventually(t, "the good pools", 15*time.Second, func() bool {
				return reflect.DeepEqual(c.Snapshot(t.Context()).Engines[0].Ranks, want)
			})
			before := c.LogStatus()[srv.URL].Lines
			appendLog(t, path, tc.bad)
			appendLog(t, path, wraptest.CRI([]string{"[2026-03-02 10:16:01 DP0 TP0] Decode batch. #running-req: 1"}, t0.Add(time.Hour), 0))
			var st logsource.Status
			testutil.Eventually(t, "the bad input counted and read past", 15*time.Second, func() bool {
				st = c.LogStatus()[srv.URL]
				return st.Skipped[tc.skipped] > 0 && st.Lines > before
			})
			e := c.Snapshot(t.Context()).Engines[0]
			if !reflect.DeepEqual(e.Ranks, want) {
				t.Fatalf("pools changed to %+v by %s", e.Ranks, tc.name)
			}
			if e.LogSource == nil || e.LogSource.Skipped == 0 || e.LogSource.Error != "" {
				t.Errorf("log source on the wire %+v", e.LogSource)
			}
			if st.LastProblem == "" || !strings.Contains(st.LastProblem, tc.skipped) {
				t.Errorf("last problem %q does not say %q", st.LastProblem, tc.skipped)
			}
		})
	}
}

// Sources that cannot be read: the status says why, in words an operator
// can act on, for the follower and for a one-shot read alike, and the
// engine reads as "pools unknown", not as fine.
func TestUnreadableSources(t *testing.T) {
	notASocket := filepath.Join(t.TempDir(), "docker.sock")
	writeLog(t, notASocket, "")
	emptyRoot := t.TempDir()
	cases := []struct {
		name, spec string
		opts       logsource.Options
		says       []string
		needs      string // a binary the case runs
	}{
		{"an unreadable docker socket", "docker:vllm", logsource.Options{DockerSocket: notASocket, DockerRoot: emptyRoot},
			[]string{notASocket, "reading the container's log file instead failed too"}, ""},
		{"a unit that does not exist", "journald:no-such-engine", logsource.Options{JournalDirectory: t.TempDir()},
			[]string{"no entries for unit no-such-engine.service"}, "journalctl"},
		{"a pod that is not on this node", "k8s:inference/vllm-0/vllm", logsource.Options{PodsRoot: emptyRoot},
			[]string{"is pod", "on this node"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needs != "" {
				if _, err := exec.LookPath(tc.needs); err != nil {
					if os.Getenv("HEFT_REQUIRE_JOURNALD") != "" {
						t.Fatalf("%s is missing and HEFT_REQUIRE_JOURNALD is set", tc.needs)
					}
					t.Skipf("%s is not installed", tc.needs)
				}
			}
			srv := startEngine(t, "vllm")
			check := func(t *testing.T, e wire.Engine) {
				t.Helper()
				if e.LogSource == nil || !strings.HasPrefix(e.LogSource.Spec, tc.spec) {
					t.Fatalf("log source %+v", e.LogSource)
				}
				for _, want := range tc.says {
					if !strings.Contains(e.LogSource.Error, want) {
						t.Errorf("error %q does not say %q", e.LogSource.Error, want)
					}
				}
				if f := health.PoolsUnknown(e); f == nil || !strings.Contains(f.Message, "cannot be read") {
					t.Errorf("no pools_unknown: %+v", f)
				}
			}
			t.Run("followed", func(t *testing.T) {
				c := follow(t, "vllm", srv.URL, tc.spec, tc.opts)
				var e wire.Engine
				testutil.Eventually(t, "the error in the status", 15*time.Second, func() bool {
					e = c.Snapshot(t.Context()).Engines[0]
					return e.LogSource != nil && e.LogSource.Error != ""
				})
				check(t, e)
			})
			t.Run("read once", func(t *testing.T) {
				c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: "vllm", URL: srv.URL, Log: tc.spec}}, LogOptions: tc.opts},
					&fakeGPUs{}, testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				if err := c.ReadLogsOnce(t.Context()); err == nil || !strings.Contains(err.Error(), tc.spec) {
					t.Errorf("ReadLogsOnce: %v, want an error naming %s", err, tc.spec)
				}
				check(t, c.Snapshot(t.Context()).Engines[0])
			})
		})
	}
}

// After a Follow fails, the next reads the run again from its start into
// a fresh tracker: the pools shown never change while it does, no
// restart is counted, and an engine that changed meanwhile shows its new
// pools once the fresh tracker has caught up.
func TestFollowAgainAfterAFailure(t *testing.T) {
	srv := startEngine(t, "vllm")
	path := filepath.Join(t.TempDir(), "sglang.log")
	content := wraptest.CRI(fixtureLines(t, "logs/sglang-dp2-uneven.log"), t0, 100)
	writeLog(t, path, content)
	c := follow(t, "sglang", srv.URL, path, logsource.Options{})
	want := []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	testutil.Eventually(t, "the pools", 15*time.Second, func() bool {
		return reflect.DeepEqual(c.Snapshot(t.Context()).Engines[0].Ranks, want)
	})

	// The path becomes a folder: Follow fails, and is tried again.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the failure in the status", 15*time.Second, func() bool {
		e := c.Snapshot(t.Context()).Engines[0]
		if !reflect.DeepEqual(e.Ranks, want) {
			t.Fatalf("pools changed to %+v while the log could not be read", e.Ranks)
		}
		return e.LogSource.Error != ""
	})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeLog(t, path, content)
	testutil.Eventually(t, "read again", 20*time.Second, func() bool {
		e := c.Snapshot(t.Context()).Engines[0]
		if !reflect.DeepEqual(e.Ranks, want) {
			t.Fatalf("pools changed to %+v while the log was read again", e.Ranks)
		}
		st := c.engines[0]
		st.mu.Lock()
		adopted := st.pending == nil
		st.mu.Unlock()
		return adopted && e.LogSource.Error == ""
	})
	if f, _ := c.engines[0].tracker.Facts(); f.Restarts != 0 {
		t.Errorf("reading the run again counted %d restarts", f.Restarts)
	}

	// The engine restarts with other pools while the log cannot be read.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the second failure", 15*time.Second, func() bool {
		return c.Snapshot(t.Context()).Engines[0].LogSource.Error != ""
	})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeLog(t, path, strings.ReplaceAll(content, "max_total_num_tokens=2925", "max_total_num_tokens=24000"))
	testutil.Eventually(t, "the new run's pools", 20*time.Second, func() bool {
		return reflect.DeepEqual(c.Snapshot(t.Context()).Engines[0].Ranks, []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 24000}})
	})
}
