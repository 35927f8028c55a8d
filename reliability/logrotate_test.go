package reliability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/collect"
	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

var (
	poolLineRE = regexp.MustCompile(`GPU KV cache size: [\d,]+ tokens`)
	stampRE    = regexp.MustCompile(`INFO \d\d-\d\d \d\d:\d\d:\d\d \[`)
)

// startUnevenVLLM starts a vLLM-flavoured sim on two ranks with uneven
// pools (24,094 and 2,925 tokens), writing its start-up log to logPath,
// and returns it with that log's text.
func startUnevenVLLM(t *testing.T, logPath string) (*sim.Server, string) {
	t.Helper()
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, SingleTPS: 800, Batch16TPS: 8000, DP: 2,
		KVTokens: []int64{24094, 2925}, LogPath: logPath}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return s, string(data)
}

// withPools rewrites a vLLM start-up log's pool lines, rank by rank, as a
// restart of the same engine beside a different neighbour would print them.
func withPools(t *testing.T, log string, pools ...int64) string {
	t.Helper()
	i := 0
	out := poolLineRE.ReplaceAllStringFunc(log, func(string) string {
		p := pools[i]
		i++
		return fmt.Sprintf("GPU KV cache size: %s tokens", commaInt(p))
	})
	if i != len(pools) {
		t.Fatalf("the log has %d pool lines, want %d", i, len(pools))
	}
	return out
}

func commaInt(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// The engine's start-up log is rotated by rename, truncated in place,
// deleted and re-created, while the agent's collector follows it: after
// each, the pools in the snapshot must be the new content's.
func TestPoolsFollowReplacedLog(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "vllm.log")
	s, original := startUnevenVLLM(t, logPath)

	col, err := collect.New(collect.Config{Node: "log-node", Engines: []engine.Config{{Kind: "vllm", URL: s.URL(), Log: logPath}}},
		noGPUs{}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	col.Start(ctx)
	defer func() { cancel(); col.Wait() }()

	var lastKey string
	expectPools := func(t *testing.T, what string, want ...int64) {
		t.Helper()
		var got []wire.Rank
		var e wire.Engine
		defer func() {
			if t.Failed() {
				t.Logf("%s: pools in the last snapshot: %v", what, got)
			}
		}()
		testutil.Eventually(t, fmt.Sprintf("%s: pools %v", what, want), 10*time.Second, func() bool {
			e = col.Snapshot(ctx).Engines[0]
			got = e.Ranks
			return slices.EqualFunc(got, want, func(r wire.Rank, w int64) bool { return r.KVTokens == w })
		})
		for i, r := range got {
			if r.DPRank != i {
				t.Fatalf("%s: ranks %v are not 0..%d in order", what, got, len(want)-1)
			}
		}
		if e.CapacityKey == "" || (lastKey != "" && e.CapacityKey != lastKey) {
			t.Fatalf("%s: capacity key %q changed from %q, though the launch arguments did not", what, e.CapacityKey, lastKey)
		}
		lastKey = e.CapacityKey
	}
	expectPools(t, "the log as the engine wrote it", 24094, 2925)

	steps := []struct {
		name    string
		pools   []int64
		replace func(t *testing.T, content string)
	}{
		{"rotated by rename", []int64{20000, 20000}, func(t *testing.T, content string) {
			if err := os.Rename(logPath, logPath+".1"); err != nil {
				t.Fatal(err)
			}
			writeFile(t, logPath, content)
		}},
		{"truncated in place (copytruncate)", []int64{9000, 9000}, func(t *testing.T, content string) {
			old, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, logPath+".2", string(old))
			if len(content) >= len(old) {
				t.Fatalf("the new content must be shorter than the old for this step")
			}
			writeFile(t, logPath, content) // O_TRUNC, same inode
		}},
		{"deleted and re-created", []int64{30000, 15000}, func(t *testing.T, content string) {
			// The engine still holds the file open when it is deleted, and
			// writes on: a later start-up's pools. Seeing them in a snapshot
			// shows the follower read on from the deleted file while its
			// path was gone, before the new file appears there.
			old, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			if err := os.Remove(logPath); err != nil {
				t.Fatal(err)
			}
			if _, err := old.WriteString(stampRE.ReplaceAllString(withPools(t, original, 11111, 11111), "INFO 12-31 23:59:58 [")); err != nil {
				t.Fatal(err)
			}
			expectPools(t, "lines written to the deleted log", 11111, 11111)
			writeFile(t, logPath, content)
		}},
		// A file truncated and at once refilled beyond the offset already
		// read (an engine restarted with its output redirected with '>',
		// that prints its start-up quickly) is still a new file.
		{"truncated and refilled past the old offset", []int64{24094, 2925}, func(t *testing.T, content string) {
			old, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			// A later start-up: its lines carry a later time.
			content = stampRE.ReplaceAllString(content, "INFO 12-31 23:59:59 [")
			content += strings.Repeat("(APIServer pid=1) INFO 01-01 00:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s\n", 3)
			if len(content) <= len(old) {
				t.Fatalf("the new content must be longer than the old for this step")
			}
			writeFile(t, logPath, content) // O_TRUNC, same inode
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.replace(t, withPools(t, original, st.pools...))
			expectPools(t, "after the log was "+st.name, st.pools...)
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
