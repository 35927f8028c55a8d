package engine

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/engine/launch"
	"heft/agent/enginelog"
	"heft/shared/health"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func newClient(t *testing.T, kind, url string, mod func(*Config)) *Client {
	t.Helper()
	cfg := Config{Kind: kind, URL: url, Node: "gpu-a", Timeout: 2 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// checkWire fails when the coordinator would refuse the engine facts.
func checkWire(t *testing.T, e wire.Engine) {
	t.Helper()
	if err := e.Validate(); err != nil {
		t.Fatalf("wire refuses the facts: %v\n%+v", err, e)
	}
}

func readLog(t *testing.T, kind, rel string) *enginelog.Facts {
	t.Helper()
	g, err := LogGrammar(kind)
	if err != nil {
		t.Fatal(err)
	}
	lf, err := enginelog.Read(g, bytes.NewReader(testutil.ReadTestdata(t, rel)))
	if err != nil {
		t.Fatalf("enginelog.Read: %v", err)
	}
	return &lf
}

func hasArg(args []string, want string) bool { return slices.Contains(args, want) }

func TestFactsVLLM(t *testing.T) {
	srv := startFake(t, "vllm", nil)
	c := newClient(t, "vllm", srv.URL+"/", nil)
	e := c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.Error != "" {
		t.Fatalf("error: %s", e.Error)
	}
	if e.URL != srv.URL || e.Model != "Qwen/Qwen3-8B" || e.Version != "0.12.0" || !e.Ready {
		t.Errorf("url %q model %q version %q ready %v", e.URL, e.Model, e.Version, e.Ready)
	}
	wantLoad := wire.Load{Known: true, Running: 14, KVUsage: 0.03082719643774619, Ranks: []wire.RankLoad{
		{DPRank: 0, Running: 8, KVUsage: 0.03082719643774619}, {DPRank: 1, Running: 6, KVUsage: 0.025656401250696022}}}
	if !reflect.DeepEqual(e.Load, wantLoad) {
		t.Errorf("load %+v", e.Load)
	}
	if len(e.Ranks) != 0 || e.RanksSource != "" {
		t.Errorf("vLLM pools must come from the log only, got %+v from %q", e.Ranks, e.RanksSource)
	}
	if e.ExpectedRanks != 0 || e.Complete != nil || e.PoolCheck != nil {
		t.Errorf("nothing shows how many ranks it runs, yet expected %d complete %v check %+v", e.ExpectedRanks, e.Complete, e.PoolCheck)
	}
	if e.CapacityKey != launch.CapacityKey("gpu-a", "vllm", "Qwen/Qwen3-8B", nil) {
		t.Errorf("capacity key %q", e.CapacityKey)
	}

	// With the start-up log: pools per rank and launch args from it.
	logPath := testutil.Testdata(t, "engines", "vllm-dp2.log")
	c = newClient(t, "vllm", srv.URL, func(cfg *Config) { cfg.Log = logPath })
	e = c.Facts(t.Context(), nil, readLog(t, "vllm", "engines/vllm-dp2.log"))
	checkWire(t, e)
	wantRanks := []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373552}}
	if !reflect.DeepEqual(e.Ranks, wantRanks) || e.RanksSource != logPath || e.RanksAt.IsZero() {
		t.Errorf("ranks %+v from %q at %v", e.Ranks, e.RanksSource, e.RanksAt)
	}
	if e.ExpectedRanks != 2 || e.Complete == nil || !*e.Complete || e.MissingRanks != nil || e.PoolCheck != nil {
		t.Errorf("expected %d complete %v missing %v check %+v, want 2 of 2 and no check (vLLM's metrics sum the ranks)",
			e.ExpectedRanks, e.Complete, e.MissingRanks, e.PoolCheck)
	}
	if e.LaunchArgsSource != SourceLog || !hasArg(e.LaunchArgs, "data_parallel_size=2") || hasArg(e.LaunchArgs, "host=0.0.0.0") {
		t.Errorf("launch args %q from %q", e.LaunchArgs, e.LaunchArgsSource)
	}
	if e.CapacityKey != launch.CapacityKey("gpu-a", "vllm", "Qwen/Qwen3-8B", e.LaunchArgs) {
		t.Errorf("capacity key %q does not cover the launch args", e.CapacityKey)
	}
}

func TestFactsSGLang(t *testing.T) {
	t.Run("metrics give per-rank pools", func(t *testing.T) {
		srv := startFake(t, "sglang", nil)
		e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
		checkWire(t, e)
		if e.Error != "" {
			t.Fatal(e.Error)
		}
		want := []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
		if !reflect.DeepEqual(e.Ranks, want) || e.RanksSource != SourceMetrics {
			t.Errorf("ranks %+v from %q", e.Ranks, e.RanksSource)
		}
		if e.Load.Running != 9 || e.Load.Waiting != 6 || len(e.Load.Ranks) != 2 {
			t.Errorf("load %+v", e.Load)
		}
		if e.ExpectedRanks != 2 || e.Complete == nil || !*e.Complete || e.PoolCheck != nil {
			t.Errorf("expected %d complete %v check %+v: the metrics' pools are the ranks, nothing to check them against", e.ExpectedRanks, e.Complete, e.PoolCheck)
		}
		if e.Version != "0.4.9.post2" || e.Model != "Qwen/Qwen3-8B" {
			t.Errorf("version %q model %q", e.Version, e.Model)
		}
		if e.LaunchArgsSource != SourceServerInfo || !hasArg(e.LaunchArgs, "data_parallel_size=2") ||
			!hasArg(e.LaunchArgs, "mem_fraction_static=0.85") {
			t.Errorf("launch args %q from %q", e.LaunchArgs, e.LaunchArgsSource)
		}
		for _, a := range e.LaunchArgs {
			if strings.HasPrefix(a, "api_key") || strings.Contains(a, "sk-very-secret") || strings.HasPrefix(a, "random_seed") {
				t.Errorf("launch args leak a secret or noise: %q", a)
			}
		}
	})
	t.Run("log pools beat metrics", func(t *testing.T) {
		srv := startFake(t, "sglang", nil)
		e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, readLog(t, "sglang", "engines/sglang-dp2-even.log"))
		checkWire(t, e)
		if e.RanksSource != SourceLog || len(e.Ranks) != 2 || e.Ranks[1].KVTokens != 24037 {
			t.Errorf("ranks %+v from %q", e.Ranks, e.RanksSource)
		}
		if e.LaunchArgsSource != SourceLog {
			t.Errorf("launch args from %q, want the log before /server_info", e.LaunchArgsSource)
		}
		// The fake's metrics are another run's (rank 1 at 2,925): they
		// travel beside the log's pools, and the two disagree.
		want := &wire.PoolCheck{Source: SourceMetrics, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}}
		if !reflect.DeepEqual(e.PoolCheck, want) {
			t.Errorf("pool check %+v, want %+v", e.PoolCheck, want)
		}
		if f := health.PoolsDisagree(e); f == nil || !strings.Contains(f.Message, "rank 1: 24,037 tokens in the log, 2,925 in /metrics") {
			t.Errorf("disagreement: %+v", f)
		}
	})
	t.Run("without metrics: /v1/loads", func(t *testing.T) {
		srv := startFake(t, "sglang", map[string]http.HandlerFunc{"/metrics": nil})
		e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
		checkWire(t, e)
		want := []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
		if e.Error != "" || !reflect.DeepEqual(e.Ranks, want) || e.RanksSource != SourceLoads {
			t.Errorf("error %q ranks %+v from %q", e.Error, e.Ranks, e.RanksSource)
		}
		if e.Load.Running != 9 || e.Load.Waiting != 6 {
			t.Errorf("load %+v", e.Load)
		}
	})
	t.Run("older: /get_load, and unranked internal_states are not trusted", func(t *testing.T) {
		srv := startFake(t, "sglang", map[string]http.HandlerFunc{"/metrics": nil, "/v1/loads": nil})
		e := newClient(t, "sglang", srv.URL, nil).Facts(t.Context(), nil, nil)
		checkWire(t, e)
		if e.Error != "" || !e.Load.Known || e.Load.Running != 9 || e.Load.Waiting != 6 {
			t.Errorf("error %q load %+v", e.Error, e.Load)
		}
		if len(e.Ranks) != 0 {
			t.Errorf("ranks %+v from %q: reply-order states must not name ranks, nor DP0's max_total_num_tokens stand for two ranks", e.Ranks, e.RanksSource)
		}
		if e.ExpectedRanks != 2 || e.Complete == nil || *e.Complete || !slices.Equal(e.MissingRanks, []int{0, 1}) {
			t.Errorf("expected %d complete %v missing %v, want 2 ranks promised, none with a pool", e.ExpectedRanks, e.Complete, e.MissingRanks)
		}
		if f := health.PoolsUnknown(e); f == nil || !strings.Contains(f.Message, "runs 2 data-parallel ranks") {
			t.Errorf("no pools_unknown: %+v", f)
		}
	})
}

func TestFactsLlamaCpp(t *testing.T) {
	srv := startFake(t, "llamacpp", nil)
	c := newClient(t, "llamacpp", srv.URL, nil)
	e := c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.Error != "" || !e.Ready {
		t.Fatalf("error %q ready %v", e.Error, e.Ready)
	}
	if want := []wire.Rank{{DPRank: 0, KVTokens: 4096 * 4}}; !reflect.DeepEqual(e.Ranks, want) || e.RanksSource != SourceProps {
		t.Errorf("ranks %+v from %q", e.Ranks, e.RanksSource)
	}
	if e.Load.Running != 2 || !e.Load.Known {
		t.Errorf("load %+v, want 2 busy slots", e.Load)
	}
	if e.Model != "qwen2.5-7b-instruct-q4_k_m" || e.Version != "b6104-3db4da56" {
		t.Errorf("model %q version %q", e.Model, e.Version)
	}

	loading := startFake(t, "llamacpp", map[string]http.HandlerFunc{"/health": func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(testutil.ReadTestdata(t, "http/llamacpp/health_loading.json"))
	}})
	e = newClient(t, "llamacpp", loading.URL, nil).Facts(t.Context(), nil, nil)
	if e.Ready || e.Error != "" {
		t.Errorf("loading model: ready %v error %q, want not ready and no error", e.Ready, e.Error)
	}

	noSlots := startFake(t, "llamacpp", map[string]http.HandlerFunc{"/slots": func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"code":501,"message":"This server does not support slots endpoint. Start it with `+"`--slots`"+`","type":"not_supported_error"}}`, http.StatusNotImplemented)
	}})
	l, err := newClient(t, "llamacpp", noSlots.URL, nil).Load(t.Context())
	if err != nil || l.Running != 2 || l.Waiting != 3 {
		t.Errorf("load from /metrics: %+v, %v", l, err)
	}

	bare := startFake(t, "llamacpp", map[string]http.HandlerFunc{"/slots": nil, "/metrics": nil})
	if _, err := newClient(t, "llamacpp", bare.URL, nil).Load(t.Context()); err == nil || !strings.Contains(err.Error(), "--metrics") {
		t.Errorf("no load source: err %v", err)
	}
}

func TestFactsOllama(t *testing.T) {
	srv := startFake(t, "ollama", nil)
	e := newClient(t, "ollama", srv.URL, nil).Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.Error != "" || !e.Ready || e.Version != "0.11.4" {
		t.Fatalf("error %q ready %v version %q", e.Error, e.Ready, e.Version)
	}
	if e.Model != "qwen3:8b" || len(e.Models) != 2 {
		t.Errorf("model %q models %v: the loaded model should win over the list", e.Model, e.Models)
	}
	if want := []wire.Rank{{DPRank: 0, KVTokens: 8192}}; !reflect.DeepEqual(e.Ranks, want) || e.RanksSource != SourceAPIPS {
		t.Errorf("ranks %+v from %q", e.Ranks, e.RanksSource)
	}
	if e.Load.Known {
		t.Errorf("ollama exposes no request counts, load %+v", e.Load)
	}

	other := newClient(t, "ollama", srv.URL, func(c *Config) { c.Model = "llama3.2:3b" }).Facts(t.Context(), nil, nil)
	if other.Model != "llama3.2:3b" || len(other.Ranks) != 0 {
		t.Errorf("override: model %q ranks %+v (a model not loaded has no context yet)", other.Model, other.Ranks)
	}
}

func TestFactsMLX(t *testing.T) {
	srv := startFake(t, "mlx", nil)
	c := newClient(t, "mlx", srv.URL, nil)
	e := c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if e.Error != "" || !e.Ready || e.Model != "mlx-community/Qwen3-8B-4bit" || e.Load.Known {
		t.Errorf("%+v", e)
	}
	if l, err := c.Load(t.Context()); err != nil || l.Known {
		t.Errorf("mlx load %+v %v", l, err)
	}
}

// deadURL returns a loopback URL where nothing listens.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func TestFactsBadEngines(t *testing.T) {
	html := testutil.ReadTestdata(t, "http/bad/login.html")
	tests := []struct {
		name      string
		kind      string
		url       func(t *testing.T) string
		wantErr   string
		wantReady bool
	}{
		{
			name: "refuses connections", kind: "vllm",
			url:     deadURL,
			wantErr: "connection refused",
		},
		{
			name: "answers HTML", kind: "sglang",
			url: func(t *testing.T) string {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/html")
					_, _ = w.Write(html)
				}))
				t.Cleanup(srv.Close)
				return srv.URL
			},
			wantErr: "answered HTML, not JSON", wantReady: true,
		},
		{
			name: "metrics do not parse", kind: "vllm",
			url: func(t *testing.T) string {
				return startFake(t, "vllm", map[string]http.HandlerFunc{"/metrics": func(w http.ResponseWriter, r *http.Request) {
					_, _ = w.Write(testutil.ReadTestdata(t, "metrics/bad-truncated.txt"))
				}}).URL
			},
			wantErr: "metrics do not parse", wantReady: true,
		},
		{
			name: "server error", kind: "vllm",
			url: func(t *testing.T) string {
				return startFake(t, "vllm", map[string]http.HandlerFunc{"/v1/models": func(w http.ResponseWriter, r *http.Request) {
					http.Error(w, "engine dead", http.StatusInternalServerError)
				}}).URL
			},
			wantErr: "GET /v1/models answered 500 Internal Server Error: engine dead", wantReady: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newClient(t, tt.kind, tt.url(t), nil).Facts(t.Context(), nil, nil)
			checkWire(t, e)
			if !strings.Contains(e.Error, tt.wantErr) {
				t.Errorf("error %q, want it to contain %q", e.Error, tt.wantErr)
			}
			if e.Ready != tt.wantReady {
				t.Errorf("ready %v, want %v", e.Ready, tt.wantReady)
			}
		})
	}
}

func TestFactsSlowEngine(t *testing.T) {
	var requests atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	c := newClient(t, "vllm", srv.URL, func(c *Config) { c.Timeout = 100 * time.Millisecond })
	e := c.Facts(t.Context(), nil, nil)
	checkWire(t, e)
	if !strings.Contains(e.Error, "no answer within 100ms") || e.Ready {
		t.Errorf("error %q ready %v", e.Error, e.Ready)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("%d requests: an engine that does not answer must not be asked again in the same read", n)
	}
	if _, err := c.Ready(t.Context()); err == nil {
		t.Error("Ready on a silent engine: no error")
	}
	if _, err := c.Load(t.Context()); err == nil {
		t.Error("Load on a silent engine: no error")
	}
}

func TestLoadAndReady(t *testing.T) {
	for _, tt := range []struct {
		kind          string
		override      map[string]http.HandlerFunc
		known         bool
		running, wait int
	}{
		{kind: "vllm", known: true, running: 14},
		{kind: "sglang", known: true, running: 9, wait: 6},
		{kind: "sglang", override: map[string]http.HandlerFunc{"/metrics": nil}, known: true, running: 9, wait: 6},
		{kind: "llamacpp", known: true, running: 2},
		{kind: "ollama"},
		{kind: "mlx"},
	} {
		t.Run(tt.kind, func(t *testing.T) {
			srv := startFake(t, tt.kind, tt.override)
			c := newClient(t, tt.kind, srv.URL, nil)
			l, err := c.Load(t.Context())
			if err != nil || l.Known != tt.known || l.Running != tt.running || l.Waiting != tt.wait {
				t.Errorf("load %+v err %v", l, err)
			}
			if ok, err := c.Ready(t.Context()); !ok || err != nil {
				t.Errorf("ready %v err %v", ok, err)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	for _, tt := range []struct{ kind, url, want string }{
		{"no-such-engine", "http://127.0.0.1:8000", "not one of"},
		{"vllm", "ftp://127.0.0.1:8000", "scheme"},
		{"vllm", "http://", "no host"},
		{"vllm", "http://127.0.0.1:8000/?x=1", "query"},
		{"vllm", "http://127.0.0.1:99999", "bad port"},
		{"vllm", "127.0.0.1:8000", "scheme"},
	} {
		if _, err := New(Config{Kind: tt.kind, URL: tt.url}, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%q, %q) = %v, want an error about %q", tt.kind, tt.url, err, tt.want)
		}
	}
	c, err := New(Config{Kind: "VLLM", URL: "http://localhost:8000/v1/"}, nil)
	if err != nil || c.Kind() != "vllm" || c.URL() != "http://localhost:8000/v1" || c.base != "http://localhost:8000" || !c.local {
		t.Errorf("New normalised to %+v, %v", c, err)
	}
}

func TestDetect(t *testing.T) {
	stripOwner := func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
	}
	tests := []struct {
		name     string
		kind     string
		override map[string]http.HandlerFunc
	}{
		{"vllm", "vllm", nil},
		{"vllm by /version", "vllm", map[string]http.HandlerFunc{"/v1/models": stripOwner}},
		{"sglang", "sglang", nil},
		{"sglang by /server_info", "sglang", map[string]http.HandlerFunc{"/v1/models": stripOwner}},
		{"llamacpp", "llamacpp", nil},
		{"llamacpp by /props", "llamacpp", map[string]http.HandlerFunc{"/v1/models": stripOwner}},
		{"ollama", "ollama", nil},
		{"mlx", "mlx", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startFake(t, tt.kind, tt.override)
			got, err := Detect(t.Context(), srv.URL, time.Second)
			if err != nil || got != tt.kind {
				t.Errorf("Detect = %q, %v; want %q", got, err, tt.kind)
			}
		})
	}
	notEngine := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notEngine.Close)
	if _, err := Detect(t.Context(), notEngine.URL, time.Second); err == nil || !strings.Contains(err.Error(), "not like any engine") {
		t.Errorf("a plain web server: %v", err)
	}
	if _, err := Detect(t.Context(), deadURL(t), time.Second); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("nothing listening: %v", err)
	}
	if PortOpen(context.Background(), deadURL(t), time.Second) {
		t.Error("PortOpen on a closed port")
	}
	open := startFake(t, "vllm", nil)
	if !PortOpen(context.Background(), open.URL, time.Second) {
		t.Error("PortOpen on an open port")
	}
}
