package collect

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine"
	"heft/agent/gpu"
	"heft/sim"
)

// BenchmarkSnapshotAgainstSim is what one poll of the agent costs: the
// link takes a snapshot every second.
func BenchmarkSnapshotAgainstSim(b *testing.B) {
	logPath := filepath.Join(b.TempDir(), "e.log")
	s, err := sim.Start(sim.Config{Flavor: "vllm", SingleTPS: 100, Batch16TPS: 1200, LogPath: logPath}, "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	src, _ := gpu.Open(hclog.NewNullLogger())
	c, err := New(Config{Node: "n", Engines: []engine.Config{{Kind: "vllm", URL: s.URL(), Log: logPath}}}, src, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Snapshot(ctx)
	}
}
