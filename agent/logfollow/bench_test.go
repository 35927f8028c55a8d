package logfollow

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkFollow reads a large existing log (200,000 engine-like lines,
// about 30 MB) to its end and reports lines per second.
func BenchmarkFollow(b *testing.B) {
	const lines = 200_000
	path := filepath.Join(b.TempDir(), "engine.log")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range lines {
		fmt.Fprintf(w, "[2026-03-02 10:15:%02d DP%d] Decode batch, #running-req: %d, #token: %d, token usage: 0.38, cuda graph: True, gen throughput (token/s): 301.52, #queue-req: 0\n",
			i%60, i%2, i%64, i*7)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	info, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(info.Size())
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		err := Follow(ctx, path, Options{Poll: time.Millisecond}, func(string) {
			if n++; n == lines {
				cancel()
			}
		})
		cancel()
		if err != nil || n != lines {
			b.Fatalf("read %d lines, err %v", n, err)
		}
	}
	b.ReportMetric(float64(lines)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}
