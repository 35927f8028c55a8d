package agent

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
	"heft/sim"
)

func busyLoad(running ...int) wire.Load {
	l := wire.Load{Known: true, Waiting: 3}
	for i, r := range running {
		l.Ranks = append(l.Ranks, wire.RankLoad{DPRank: i, Running: r})
		l.Running += r
	}
	return l
}

// A window of saturation (every rank at the burst's per-rank load, work
// waiting) is a capacity reading; anything else starts over.
func TestPassiveReadings(t *testing.T) {
	p := &passive{window: 30 * time.Second, perRank: 16, ranks: 2}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	// 1,800 tok/s with both ranks full; one rank short at 10 s starts over.
	gen := 0.0
	for s := 0; s <= 10; s += 5 {
		load := busyLoad(16, 16)
		if s == 10 {
			load = busyLoad(16, 8)
		}
		if r := p.add(at(s), engine.Counters{Generated: gen, Load: load}); r != nil {
			t.Fatalf("reading at %d s: %+v", s, r)
		}
		gen += 5 * 1800
	}
	var got *wire.Passive
	for s := 15; s <= 45; s += 5 {
		got = p.add(at(s), engine.Counters{Generated: gen, Load: busyLoad(16, 17)})
		if got != nil && s != 45 {
			t.Fatalf("reading after %d s of a 30 s window: %+v", s-15, got)
		}
		gen += 5 * 1800
	}
	if got == nil || got.ThroughputTPS != 1800 || got.WindowSeconds != 30 || got.Concurrency != 33 || got.Spread != 0 || !got.At.Equal(at(45)) {
		t.Fatalf("reading %+v, want 1800 tok/s over 30 s at 33 running", got)
	}

	// No work waiting: not saturated, no reading; the last one is kept.
	if r := p.add(at(50), engine.Counters{Generated: gen, Load: wire.Load{Known: true, Ranks: busyLoad(16, 16).Ranks}}); r != nil || p.latest != got {
		t.Errorf("unsaturated sample gave %+v", r)
	}
}

// The whole agent: an engine kept saturated by its users (every rank at
// the burst's per-rank load, more waiting) gets a passive reading in its
// snapshots, with no burst sent.
func TestPassiveReadingInSnapshots(t *testing.T) {
	s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, Model: "test/model", SingleTPS: 200, Batch16TPS: 1600, DP: 2, MaxRunning: 4}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	fc, _ := startAgentOn(t, s, wire.EngineSGLang, nil, withPassiveWindow(500*time.Millisecond))

	ctx, cancel := context.WithCancel(t.Context())
	var users sync.WaitGroup
	t.Cleanup(func() { cancel(); users.Wait() })
	body := []byte(`{"model":"test/model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":5000,"ignore_eos":true}`)
	for range 12 { // 4 running per rank, 4 waiting
		users.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body) // until cancel
				resp.Body.Close()
			}
		})
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		e := fc.Next(t, wire.TypeSnapshot).Snapshot.Engines[0]
		if p := e.Passive; p != nil {
			t.Logf("passive: %.0f tok/s over %.2f s at %d running", p.ThroughputTPS, p.WindowSeconds, p.Concurrency)
			if p.ThroughputTPS <= 0 || p.Concurrency < 8 || p.WindowSeconds < 0.5 {
				t.Fatalf("passive %+v", p)
			}
			return
		}
	}
	t.Fatal("no passive reading within a minute of saturation")
}
