package collect

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/agent/logsource"
	"heft/shared/health"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// The running agent reads llama.cpp's and Ollama's start-up logs as
// heft-agent pools does: one pool, rank 0, from the log's KV cells (or
// n_ctx), ahead of what the endpoints say, which checks it where it means
// the same pool.
func TestFollowsLlamaCppAndOllamaLogs(t *testing.T) {
	dir := t.TempDir()

	// llama.cpp: heft-sim prints its start-up lines (a split cache of 4
	// slots, 4,096 cells each: 16,384); /props says the same, so the check
	// finds no disagreement.
	llamaLog := filepath.Join(dir, "llama.log")
	llama, err := sim.Start(sim.Config{Flavor: sim.FlavorLlamaCpp, SingleTPS: 50, Batch16TPS: 400, KVTokens: []int64{16384}, MaxRunning: 4, LogPath: llamaLog}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = llama.Close() })
	c := follow(t, wire.EngineLlamaCpp, llama.URL(), llamaLog, logsource.Options{})
	var e wire.Engine
	testutil.Eventually(t, "llama.cpp's pool from its log", 15*time.Second, func() bool {
		e = c.Snapshot(t.Context()).Engines[0]
		return e.RanksSource == llamaLog
	})
	if want := []wire.Rank{{DPRank: 0, KVTokens: 16384}}; !reflect.DeepEqual(e.Ranks, want) || e.Complete == nil || !*e.Complete {
		t.Fatalf("ranks %+v complete %v, want %+v complete", e.Ranks, e.Complete, want)
	}
	if e.PoolCheck == nil || e.PoolCheck.Source != engine.SourceProps || health.PoolsDisagree(e) != nil {
		t.Errorf("pool check %+v, disagree %+v; want /props agreeing", e.PoolCheck, health.PoolsDisagree(e))
	}
	if l := c.engines[0].logStatus(); l == nil || l.Error != "" {
		t.Errorf("log status %+v", l)
	}

	// The server restarts with a smaller context (-c 8192, still 4 slots:
	// n_ctx halves, and so does each slot's stream of cells): the log's new
	// pool wins, and /props (still the sim's 16,384) disagreeing is said.
	text, err := os.ReadFile(llamaLog)
	if err != nil {
		t.Fatal(err)
	}
	restart := regexp.MustCompile(`\b16384\b`).ReplaceAllString(string(text), "8192")
	appendLog(t, llamaLog, regexp.MustCompile(`\b4096\b`).ReplaceAllString(restart, "2048"))
	testutil.Eventually(t, "the restart's pool", 15*time.Second, func() bool {
		e = c.Snapshot(t.Context()).Engines[0]
		return len(e.Ranks) == 1 && e.Ranks[0].KVTokens == 8192
	})
	if f := health.PoolsDisagree(e); f == nil || !strings.Contains(f.Message, "16,384") {
		t.Errorf("disagreement %+v", f)
	}

	// Ollama: a 2024 server log (a real one, testdata/engines/wild) whose
	// runner was started with n_ctx = 128. /api/ps names one request's
	// context, not the runner's whole cache, so it checks nothing.
	ollamaLog := filepath.Join(dir, "ollama.log")
	writeLog(t, ollamaLog, string(testutil.ReadTestdata(t, "engines/wild/ollama-2024-n-ctx.log")))
	ollama, err := sim.Start(sim.Config{Flavor: sim.FlavorOllama, SingleTPS: 50, Batch16TPS: 400, KVTokens: []int64{8192}}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ollama.Close() })
	c = follow(t, wire.EngineOllama, ollama.URL(), ollamaLog, logsource.Options{})
	testutil.Eventually(t, "Ollama's pool from its log", 15*time.Second, func() bool {
		e = c.Snapshot(t.Context()).Engines[0]
		return e.RanksSource == ollamaLog
	})
	if want := []wire.Rank{{DPRank: 0, KVTokens: 128}}; !reflect.DeepEqual(e.Ranks, want) || e.PoolCheck != nil {
		t.Errorf("ranks %+v check %+v, want %+v and no check", e.Ranks, e.PoolCheck, want)
	}
}
