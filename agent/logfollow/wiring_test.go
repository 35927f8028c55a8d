package logfollow_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/logfollow"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// The way the agent wires a followed log to a Tracker: a copytruncate
// rotation keeps the pools (flagged as from the previous file) until the
// engine's next start-up replaces them.
func TestFollowFeedsTracker(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sglang.log")
	first := "[2025-07-14 09:02:11] server_args=ServerArgs(model_path='m', dp_size=2)\n" +
		"[2025-07-14 09:02:27 DP0] KV Cache is allocated. #tokens: 24094, K size: 1.65 GB, V size: 1.65 GB\n" +
		"[2025-07-14 09:02:27 DP1] KV Cache is allocated. #tokens: 2925, K size: 0.20 GB, V size: 0.20 GB\n"
	if err := os.WriteFile(path, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := engine.LogGrammar("sglang")
	if err != nil {
		t.Fatal(err)
	}
	tr := enginelog.NewTracker(g)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- logfollow.Follow(ctx, path, logfollow.Options{
			Poll:    2 * time.Millisecond,
			OnReset: func(string) { tr.Reset() },
		}, tr.Feed)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Follow: %v", err)
		}
	}()
	waitFacts := func(want []wire.Rank, fromPrevious bool) {
		t.Helper()
		defer func() {
			if t.Failed() {
				f, _ := tr.Facts()
				t.Logf("facts = %+v", f)
			}
		}()
		testutil.Eventually(t, fmt.Sprintf("ranks %v, fromPrevious %v", want, fromPrevious), 10*time.Second, func() bool {
			f, ok := tr.Facts()
			return ok && slices.Equal(f.Ranks, want) && f.FromPreviousFile == fromPrevious
		})
	}
	waitFacts([]wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}, false)

	// copytruncate, then only traffic: the pools stand.
	if err := os.WriteFile(path, []byte("[2025-07-14 10:00:00 DP0] Decode batch. #running-req: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFacts([]wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}, true)

	// The engine restarts and logs a new start-up.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("[2025-07-14 11:00:00] server_args=ServerArgs(model_path='m', dp_size=2)\n" +
		"[2025-07-14 11:00:20 DP0] KV Cache is allocated. #tokens: 24101, K size: 1.65 GB, V size: 1.65 GB\n" +
		"[2025-07-14 11:00:20 DP1] KV Cache is allocated. #tokens: 24088, K size: 1.65 GB, V size: 1.65 GB\n")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	waitFacts([]wire.Rank{{DPRank: 0, KVTokens: 24101}, {DPRank: 1, KVTokens: 24088}}, false)
}
