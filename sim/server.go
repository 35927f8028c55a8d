package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Server is a running simulated engine.
type Server struct {
	cfg   Config
	ln    net.Listener
	hs    *http.Server
	url   string
	host  string
	port  int
	pid   int
	start time.Time
	ranks []*rank

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	rr    atomic.Uint64 // round-robin dealer
	chats atomic.Int64  // chat requests seen, for FailEvery
	ids   atomic.Uint64
	meet  meetings // load requests that shared the engine with another's

	rngMu sync.Mutex
	rng   *rand.Rand

	closeOnce sync.Once
	closeErr  error
}

// Start validates cfg, listens on addr (e.g. "127.0.0.1:0"), writes the
// start-up log, and starts one decode loop per rank.
func Start(cfg Config, addr string) (*Server, error) {
	if _, err := cfg.normalize(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sim listen: %w", err)
	}
	return Serve(cfg, ln)
}

// Serve is Start on a listener of the caller's, whose address must be a
// TCP address; the server owns ln from then on and closes it. A test
// serves an in-memory listener (shared/memnet) inside a testing/synctest
// bubble, where the sim's steps, and so every throughput, cold start and
// queue it shows, run on the bubble's clock.
func Serve(cfg Config, ln net.Listener) (*Server, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		ln.Close()
		return nil, err
	}
	tcp, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("sim: listener address %s is not a TCP address", ln.Addr())
	}
	s := &Server{
		cfg: cfg,
		ln:  ln,
		pid: os.Getpid(),
		rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x68656674)),
	}
	s.port = tcp.Port
	s.host = tcp.IP.String()
	urlHost := s.host
	if tcp.IP.IsUnspecified() {
		urlHost = "127.0.0.1"
	}
	s.url = "http://" + net.JoinHostPort(urlHost, strconv.Itoa(s.port))
	if cfg.LogPath != "" {
		if err := s.writeStartLog(time.Now()); err != nil {
			ln.Close()
			return nil, fmt.Errorf("sim start-up log: %w", err)
		}
	}

	s.start = time.Now()
	rs := cfg.rankSetup(s.start)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for i, pool := range cfg.KVTokens {
		r := newRank(i, pool, rs)
		s.ranks = append(s.ranks, r)
		s.wg.Go(func() { r.loop(s.ctx) })
	}
	s.hs = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Go(func() {
		if err := s.hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.cancel()
		}
	})
	return s, nil
}

// rankSetup is what every rank of an engine configured as c shares; the
// cold period counts from start.
func (c Config) rankSetup(start time.Time) rankSetup {
	t0, k, _ := calibrate(c.SingleTPS, c.Batch16TPS)
	rs := rankSetup{
		accept:      max(1, c.SpecAccept),
		itlPerToken: c.Flavor == FlavorSGLang,
		maxRunning:  c.MaxRunning,
		budget:      int64(c.MaxBatchedTokens),
		mixed:       mixedSteps(c.Flavor),
		model: stepModel{
			t0: t0, k: k, prefillTPS: c.PrefillTPS, start: start, coldFactor: c.ColdFactor,
			coldFor: time.Duration(c.ColdSeconds * float64(time.Second)), slow: c.Slow,
		},
		freePrefill: c.PrefillTPS == 0 || c.Faults.PrefillCached,
	}
	switch {
	case c.Flavor == FlavorSGLang:
		rs.logEvery, rs.idleLogEvery = c.DecodeLogInterval, c.IdleLogEvery
	case c.Flavor == FlavorVLLM && c.Faults.StaleGaugesOnAbort:
		rs.stepGauges = true
	}
	if !c.NoPrefixCache {
		rs.cacheBlock = prefixBlock(c.Flavor)
	}
	return rs
}

// URL is the engine's base URL, e.g. "http://127.0.0.1:41234".
func (s *Server) URL() string { return s.url }

// Config is the configuration in use, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Close stops the listener, open connections and the rank loops. It is
// idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.closeErr = s.hs.Close()
		s.wg.Wait()
	})
	return s.closeErr
}

// InFlight sums the running and waiting sequences over all ranks.
func (s *Server) InFlight() (running, waiting int) {
	for _, r := range s.ranks {
		r.mu.Lock()
		running += len(r.running)
		waiting += len(r.waiting)
		r.mu.Unlock()
	}
	return running, waiting
}

// Ranks returns the KV pool of each rank, in tokens.
func (s *Server) Ranks() []int64 {
	out := make([]int64, len(s.ranks))
	for i, r := range s.ranks {
		out[i] = r.pool
	}
	return out
}

func (s *Server) ready() bool { return time.Since(s.start) >= s.cfg.Faults.NotReadyFor }

func (s *Server) views() []rankView {
	out := make([]rankView, len(s.ranks))
	for i, r := range s.ranks {
		out[i] = r.view()
	}
	return out
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("GET "+MeetingsPath, s.handleMeetings)
	switch s.cfg.Flavor {
	case FlavorVLLM:
		mux.HandleFunc("GET /metrics", s.handleVLLMMetrics)
		mux.HandleFunc("POST /tokenize", s.handleVLLMTokenize)
		mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version})
		})
	case FlavorSGLang:
		mux.HandleFunc("GET /metrics", s.handleSGLangMetrics)
		mux.HandleFunc("GET /server_info", s.handleServerInfo)
		mux.HandleFunc("GET /get_server_info", s.handleServerInfo)
		mux.HandleFunc("GET /model_info", s.handleModelInfo)
		mux.HandleFunc("GET /get_model_info", s.handleModelInfo)
		mux.HandleFunc("GET /v1/loads", s.handleLoads)
		mux.HandleFunc("POST /tokenize", s.handleSGLangTokenize)
		mux.HandleFunc("POST /v1/tokenize", s.handleSGLangTokenize)
	case FlavorMLX:
		mux.HandleFunc("POST /chat/completions", s.handleChat)
	case FlavorLlamaCpp:
		mux.HandleFunc("GET /metrics", s.handleLlamaMetrics)
		mux.HandleFunc("GET /props", s.handleProps)
		mux.HandleFunc("GET /slots", s.handleSlots)
		mux.HandleFunc("POST /tokenize", s.handleLlamaTokenize)
	case FlavorOllama:
		mux.HandleFunc("GET /{$}", s.handleHealth)
		mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version})
		})
		mux.HandleFunc("GET /api/ps", s.handleOllamaPS)
		mux.HandleFunc("GET /api/tags", s.handleOllamaTags)
	}
	if s.cfg.Flavor == FlavorLlamaCpp {
		// llama-server answers every route with 503 while the model loads.
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !s.ready() {
				writeLlamaLoading(w)
				return
			}
			mux.ServeHTTP(w, r)
		})
	}
	return mux
}

func writeLlamaLoading(w http.ResponseWriter) {
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{
		"error": map[string]any{"code": 503, "message": "Loading model", "type": "unavailable_error"},
	})
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if !s.ready() {
		if s.cfg.Flavor == FlavorLlamaCpp {
			writeLlamaLoading(w)
			return
		}
		http.Error(w, "engine is starting", http.StatusServiceUnavailable)
		return
	}
	switch s.cfg.Flavor {
	case FlavorMLX, FlavorLlamaCpp:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case FlavorOllama:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("Ollama is running"))
	default:
		w.WriteHeader(http.StatusOK)
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	m := map[string]any{
		"id": s.cfg.Model, "object": "model", "created": s.start.Unix(),
		"owned_by": s.cfg.Flavor,
	}
	switch s.cfg.Flavor {
	case FlavorVLLM:
		m["root"], m["parent"], m["max_model_len"] = s.cfg.Model, nil, s.cfg.MaxModelLen
	case FlavorSGLang:
		m["root"], m["max_model_len"] = s.cfg.Model, s.cfg.MaxModelLen
	case FlavorOllama:
		m["owned_by"] = "library"
	case FlavorLlamaCpp:
		m["owned_by"] = "llamacpp"
		m["meta"] = map[string]any{"n_ctx_train": 40960}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{m}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
