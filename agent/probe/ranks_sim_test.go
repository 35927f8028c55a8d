package probe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/agent/engine"
	"heft/shared/testutil"
	"heft/shared/wire"
	"heft/sim"
)

// metricsProxy is a loopback proxy in front of a heft-sim, for the
// agent's engine client: once armed, its /metrics answers lose every
// series of one rank (drop, a label pair such as engine="1") for the next
// dropPages answers (every one where negative), or read as an engine that
// restarted (every counter and histogram count from 0 at the first
// answer after arming).
type metricsProxy struct {
	url string

	mu        sync.Mutex
	armed     bool
	drop      string
	dropPages int
	restart   bool
	base      map[string]float64 // restart: each series' value at the first armed answer
}

func newMetricsProxy(t *testing.T, target string) *metricsProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &metricsProxy{base: map[string]float64{}}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(u)
		r.Out.Header.Del("Accept-Encoding") // a page to rewrite, not a gzip stream
	}}
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/metrics" {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		body = p.rewrite(body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// arm starts the faults: drop's lines missing from the next pages
// answers (every one where negative), or, with restart, counters from 0.
func (p *metricsProxy) arm(drop string, pages int, restart bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.drop, p.dropPages, p.restart = true, drop, pages, restart
}

func (p *metricsProxy) rewrite(body []byte) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.armed {
		return body
	}
	dropping := p.drop != "" && p.dropPages != 0
	if p.dropPages > 0 {
		p.dropPages--
	}
	var out strings.Builder
	for line := range strings.Lines(string(body)) {
		switch {
		case dropping && strings.Contains(line, p.drop):
			continue
		case p.restart && !strings.HasPrefix(line, "#"):
			line = p.rebase(line)
		}
		out.WriteString(line)
	}
	return []byte(out.String())
}

// rebase gives a counter's or a histogram count's sample as counted from
// the first armed answer, as an engine restarted then would.
func (p *metricsProxy) rebase(line string) string {
	sample := strings.TrimSpace(line)
	name, _, _ := strings.Cut(sample, "{")
	name, _, _ = strings.Cut(name, " ")
	cut := strings.LastIndexByte(sample, ' ')
	if cut < 0 || !strings.HasSuffix(name, "_total") && !strings.HasSuffix(name, "_count") {
		return line
	}
	v, err := strconv.ParseFloat(sample[cut+1:], 64)
	if err != nil {
		return line
	}
	series := sample[:cut]
	if _, ok := p.base[series]; !ok {
		p.base[series] = v
	}
	return series + " " + strconv.FormatFloat(v-p.base[series], 'g', -1, 64) + "\n"
}

// rankSim is a heft-sim of flavor with dp ranks, an engine client that
// reads it through a metricsProxy, and a probe Config that reads it as
// the agent does (16 requests per rank, its counter reader handing on the
// generated total alone) and arms the proxy as the burst of phase ends,
// before the counter is read after it. Its bursts are not watched, so the
// checks after them alone judge them.
func rankSim(t *testing.T, flavor string, dp int, phase string, arm func(*metricsProxy)) (*sim.Server, Config) {
	t.Helper()
	s := startSim(t, sim.Config{Flavor: flavor, DP: dp, SingleTPS: 100, Batch16TPS: 1000, MaxRunning: 64})
	proxy := newMetricsProxy(t, s.URL())
	client, err := engine.New(engine.Config{Kind: flavor, URL: proxy.url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	return s, Config{URL: s.URL(), Kind: flavor, Concurrency: DefaultConcurrency * dp, Ranks: dp, Tokens: 128,
		CapacityKey: "k", Trigger: wire.ReasonOnDemand, ReadyTimeout: 10 * time.Second, BurstTimeout: 2 * time.Minute,
		settle: 50 * time.Millisecond, watchPoll: time.Hour,
		Load:     client.Load,
		Counters: client.Counters,
		Progress: func(p Progress) {
			if p.Phase == phase && p.Total > 0 && p.Done == p.Total {
				once.Do(func() { arm(proxy) })
			}
		}}
}

// vLLM sums its generated-tokens counter over the engine label of its
// data-parallel ranks. A read after the burst that lacks a rank's series
// hid all that rank made, other traffic included: users who joined the
// measured burst of a DP2 engine (2,048 tokens a rank) added a few hundred
// tokens a rank, and the sum without rank 1 grew by rank 0's share of
// theirs alone, within what the burst received: stored as a clean burst.
// Now such a pair is not one counter: the counter is read again, and the
// second read, with both ranks, shows the users and the burst is
// discarded; on a quiet engine it is checked as ever. A rank missing from
// every read after the burst leaves a pair that cannot be compared: the
// burst is kept with the note that its traffic was not checked, never as
// checked.
func TestSimRankMissingAfterBurst(t *testing.T) {
	t.Parallel()
	t.Run("once, users joined: discarded", func(t *testing.T) {
		t.Parallel()
		s, cfg := rankSim(t, sim.FlavorVLLM, 2, PhaseMeasure, func(p *metricsProxy) { p.arm(`engine="1"`, 1, false) })
		ctx, cancel := context.WithCancel(t.Context())
		var users sync.WaitGroup
		defer func() { cancel(); users.Wait() }()
		var joined sync.Once
		arm := cfg.Progress
		cfg.Progress = func(p Progress) {
			if p.Phase == PhaseMeasure {
				joined.Do(func() { streamUsers(ctx, &users, s.URL(), 4) }) // users arrive as the measured burst starts
			}
			arm(p)
		}
		m, err := Run(t.Context(), cfg)
		if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "other traffic shared the engine") {
			t.Fatalf("err = %v; valid %v, %.0f tok/s, engine counted %d for %d, problems %q",
				err, m.Valid(), m.ThroughputTPS, m.EngineGeneratedTokens, m.OutputTokens, m.Problems)
		}
	})
	t.Run("once, quiet: checked", func(t *testing.T) {
		t.Parallel()
		_, cfg := rankSim(t, sim.FlavorVLLM, 2, PhaseMeasure, func(p *metricsProxy) { p.arm(`engine="1"`, 1, false) })
		m := mustRun(t, cfg)
		if !m.Valid() || m.OutputTokens != 4096 || m.EngineGeneratedTokens < 4096 || m.EngineGeneratedTokens > 4096+64 ||
			hasProblem(m, "not checked") {
			t.Fatalf("valid %v, engine counted %d for %d, problems %q", m.Valid(), m.EngineGeneratedTokens, m.OutputTokens, m.Problems)
		}
	})
	t.Run("every read after: not checked", func(t *testing.T) {
		t.Parallel()
		_, cfg := rankSim(t, sim.FlavorVLLM, 2, PhaseMeasure, func(p *metricsProxy) { p.arm(`engine="1"`, -1, false) })
		m := mustRun(t, cfg)
		if !m.Valid() || m.EngineGeneratedTokens != 0 ||
			!hasProblem(m, "other traffic during the burst not checked: the engine's generated-tokens counter was summed over other ranks") {
			t.Fatalf("valid %v, engine counted %d, problems %q", m.Valid(), m.EngineGeneratedTokens, m.Problems)
		}
	})
}

// An engine whose counters went back between the reads before and after
// a burst restarted in between: the measured burst did not measure the
// engine as it now is, and is discarded, whether its counter is summed
// over ranks (vLLM DP2) or one series (SGLang, its tokens sent counted
// from its histograms); after a warm-up, the measured burst is not sent
// onto a cold engine. Before, it was measured and stored with a note.
func TestSimCounterWentBackDiscarded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flavor, phase, want string
		dp                  int
	}{
		{sim.FlavorVLLM, PhaseMeasure, "during the measured burst", 2},
		{sim.FlavorSGLang, PhaseMeasure, "during the measured burst", 1},
		{sim.FlavorVLLM, PhaseWarmup, "the measured burst was not sent", 2},
	} {
		t.Run(tc.flavor+"/"+tc.phase, func(t *testing.T) {
			t.Parallel()
			s, cfg := rankSim(t, tc.flavor, tc.dp, tc.phase, func(p *metricsProxy) { p.arm("", 0, true) })
			// Its counters had moved before the probe: a restart sends
			// them back even where the probe read them first.
			served(t, s.URL())
			testutil.Eventually(t, "the request to end", 10*time.Second, func() bool { r, w := s.InFlight(); return r+w == 0 })
			m, err := Run(t.Context(), cfg)
			if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "generated-tokens counter went back") ||
				!strings.Contains(err.Error(), "the engine restarted") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; valid %v, %.0f tok/s, problems %q", err, m.Valid(), m.ThroughputTPS, m.Problems)
			}
		})
	}
}

// Engines whose generated-tokens counter is one series are checked as
// before, whatever their other series do: SGLang DP2 (its tokens sent,
// from histograms without a rank label), with every rank-1 gauge missing
// from the reads after the burst, and llama.cpp.
func TestSimOneSeriesCounterChecked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flavor string
		dp     int
		drop   string
	}{{sim.FlavorSGLang, 2, `dp_rank="1"`}, {sim.FlavorLlamaCpp, 1, ""}} {
		t.Run(tc.flavor, func(t *testing.T) {
			t.Parallel()
			_, cfg := rankSim(t, tc.flavor, tc.dp, PhaseMeasure, func(p *metricsProxy) { p.arm(tc.drop, -1, false) })
			m := mustRun(t, cfg)
			out := int64(m.OutputTokens)
			if !m.Valid() || out != int64(cfg.Concurrency*cfg.Tokens) || m.EngineGeneratedTokens < out || m.EngineGeneratedTokens > out+64 ||
				hasProblem(m, "not checked") {
				t.Fatalf("valid %v, engine counted %d for %d, problems %q", m.Valid(), m.EngineGeneratedTokens, m.OutputTokens, m.Problems)
			}
		})
	}
}

// served sends the engine at url one request of a few tokens, and reads
// its answer.
func served(t *testing.T, url string) {
	t.Helper()
	body := `{"model":"` + sim.DefaultModel + `","messages":[{"role":"user","content":"hi"}],"max_tokens":16}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("request: %s, %v", resp.Status, err)
	}
}
