// Package loadgen is the routing benchmark's load generator: a bounded
// open loop of streamed chat completions. Arrivals are Poisson at a given
// rate and never wait for each other; at most MaxInFlight requests are
// open at once and an arrival beyond that is refused and counted, never
// dropped silently. Every request asks for exactly Tokens output tokens
// (max_tokens = min_tokens plus ignore_eos, as heft's probe does). It
// reports time to first token, latency, delivered tokens per second, what
// was left unfinished when the run ended, and the split over backends.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"time"

	"heft/sim"
)

// Config describes one run.
type Config struct {
	// URL is the gateway's (or an engine's) base URL; requests go to
	// URL + "/v1/chat/completions".
	URL   string
	Model string // sent as "model"; "" leaves it to the engine
	// Rate is the mean arrival rate, requests per second (open loop).
	Rate float64
	// Sequential sends one request at a time instead (the quiet case):
	// the next starts when the previous ends. Rate is then unused.
	Sequential bool
	// Duration is how long arrivals come; Requests, when > 0, stops them
	// after that many as well.
	Duration time.Duration
	Requests int
	// MaxInFlight bounds the requests open at once (default 256).
	MaxInFlight int
	Tokens      int    // output tokens per request (default 128)
	Prompt      string // default: a short fixed prompt
	// Drain is how long open requests may finish after arrivals stop
	// (default 60 s); those still open then are cut and counted as
	// unfinished.
	Drain time.Duration
	// BackendHeader names the response header that says which backend
	// answered (default "X-Heft-Backend": HAProxy sets it with
	// "http-response set-header X-Heft-Backend %s", nginx with
	// "add_header X-Heft-Backend $upstream_addr always"). Without it the
	// streamed chunks' "model" names the backend, which is enough when
	// every simulated worker serves under its own model name.
	BackendHeader string
	Seed          uint64
	Client        *http.Client // default: a client without timeouts
	// KeepRequests keeps a record of every request in Result.Requests,
	// for questions about when a backend got its requests.
	KeepRequests bool
	// ResendClosed sends a request again, on another connection, when the
	// kept-alive connection it went out on closed before any byte of an
	// answer (a gateway's old process leaving after a reload): the client
	// remedy of docs/gateways.md, by Go's own retry for a request with an
	// Idempotency-Key header. Off, such a request fails as
	// "closed_kept_alive".
	ResendClosed bool
	// Label marks every request as this load's (heft-sim's LoadHeader),
	// so a heft-sim behind the gateway can count the load requests that
	// shared it with a probe's; "" sends no mark.
	Label string
}

// Request is one request's record (Result.Requests, with KeepRequests).
type Request struct {
	Backend string    `json:"backend"`
	Start   time.Time `json:"start"` // when it was sent
	End     time.Time `json:"end"`
	Tokens  int64     `json:"tokens"`
	// Outcome is "completed", "unfinished" or the failure's class (as in
	// Result.Errors).
	Outcome string `json:"outcome"`
}

// Summary is the distribution of one duration over requests.
type Summary struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50"`
	P95  time.Duration `json:"p95"`
	Mean time.Duration `json:"mean"`
	Max  time.Duration `json:"max"`
}

// Backend is what one backend got.
type Backend struct {
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`
	Tokens    int64   `json:"tokens"`
	Latency   Summary `json:"latency"`
}

// Result is one run's outcome. Arrivals = Sent + Refused, and
// Sent = Completed + Failed + Unfinished.
type Result struct {
	Arrivals   int `json:"arrivals"`
	Sent       int `json:"sent"`
	Refused    int `json:"refused"` // arrivals over MaxInFlight
	Completed  int `json:"completed"`
	Failed     int `json:"failed"`
	Unfinished int `json:"unfinished"` // still open when the drain ended
	// OutputTokens counts every token received, of unfinished and
	// failed streams too.
	OutputTokens int64 `json:"output_tokens"`
	// Elapsed runs from the first arrival to the end of the last request
	// (or the end of the drain).
	Elapsed         time.Duration       `json:"elapsed"`
	TokensPerSecond float64             `json:"tokens_per_second"`
	Latency         Summary             `json:"latency"` // of completed requests
	TTFT            Summary             `json:"ttft"`    // of completed requests
	Backends        map[string]*Backend `json:"backends"`
	Errors          map[string]int      `json:"errors"` // failure class → count
	// Resent counts the requests sent again after their kept-alive
	// connection closed before an answer (ResendClosed).
	Resent   int       `json:"resent,omitempty"`
	Requests []Request `json:"requests,omitempty"`
}

// outcome is one request's.
type outcome struct {
	backend    string
	tokens     int64
	ttft, lat  time.Duration
	err        error
	unfinished bool
	start, end time.Time
	resent     bool // sent again after its kept-alive connection closed
}

// Run runs the load and returns what happened. It returns early, with
// what it has, when ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.normalize(); err != nil {
		return Result{}, err
	}
	body, err := requestBody(cfg)
	if err != nil {
		return Result{}, err
	}
	// reqCtx cuts the requests still open when the drain ends.
	reqCtx, cut := context.WithCancel(ctx)
	defer cut()

	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	res := Result{Backends: map[string]*Backend{}, Errors: map[string]int{}}
	sem := make(chan struct{}, cfg.MaxInFlight)
	send := func() {
		o := do(reqCtx, cfg, body)
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	start := time.Now()
	stop := start.Add(cfg.Duration)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6c6f6164))

	if cfg.Sequential {
		for time.Now().Before(stop) && (cfg.Requests == 0 || res.Arrivals < cfg.Requests) && ctx.Err() == nil {
			res.Arrivals++
			res.Sent++
			send()
		}
	} else {
		next := start
		for ctx.Err() == nil {
			next = next.Add(time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second)))
			if !next.Before(stop) || (cfg.Requests > 0 && res.Arrivals >= cfg.Requests) {
				break
			}
			if !sleepUntil(ctx, next) {
				break
			}
			res.Arrivals++
			select {
			case sem <- struct{}{}:
				res.Sent++
				wg.Go(func() {
					defer func() { <-sem }()
					send()
				})
			default:
				res.Refused++
			}
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain := time.NewTimer(cfg.Drain)
	select {
	case <-done:
	case <-drain.C:
		cut()
		<-done
	case <-ctx.Done():
		cut()
		<-done
	}
	drain.Stop()

	end := start
	var lat, ttft []time.Duration
	per := map[string][]time.Duration{}
	for _, o := range outcomes {
		end = later(end, o.end)
		res.OutputTokens += o.tokens
		b := res.Backends[o.backend]
		if b == nil {
			b = &Backend{}
			res.Backends[o.backend] = b
		}
		b.Requests++
		b.Tokens += o.tokens
		if o.resent {
			res.Resent++
		}
		outcome := "completed"
		switch {
		case o.unfinished:
			res.Unfinished++
			outcome = "unfinished"
		case o.err != nil:
			res.Failed++
			outcome = errorClass(o.err)
			res.Errors[outcome]++
		default:
			res.Completed++
			b.Completed++
			lat = append(lat, o.lat)
			ttft = append(ttft, o.ttft)
			per[o.backend] = append(per[o.backend], o.lat)
		}
		if cfg.KeepRequests {
			res.Requests = append(res.Requests, Request{Backend: o.backend, Start: o.start, End: o.end, Tokens: o.tokens, Outcome: outcome})
		}
	}
	for name, ls := range per {
		res.Backends[name].Latency = Summarize(ls)
	}
	res.Latency, res.TTFT = Summarize(lat), Summarize(ttft)
	res.Elapsed = end.Sub(start)
	if res.Elapsed > 0 {
		res.TokensPerSecond = float64(res.OutputTokens) / res.Elapsed.Seconds()
	}
	return res, ctx.Err()
}

func (c *Config) normalize() error {
	switch {
	case c.URL == "":
		return errors.New("loadgen: no URL")
	case !c.Sequential && !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("loadgen: rate must be a positive number of requests per second, got %v", c.Rate)
	case c.Duration <= 0 && c.Requests <= 0:
		return errors.New("loadgen: set a duration or a number of requests")
	}
	if c.Duration <= 0 {
		c.Duration = 100 * 365 * 24 * time.Hour // only Requests stops the arrivals
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 256
	}
	if c.Tokens <= 0 {
		c.Tokens = 128
	}
	if c.Prompt == "" {
		c.Prompt = "Write a short story about a lighthouse keeper who counts ships."
	}
	if c.Drain <= 0 {
		c.Drain = 60 * time.Second
	}
	if c.BackendHeader == "" {
		c.BackendHeader = "X-Heft-Backend"
	}
	if c.Client == nil {
		c.Client = http.DefaultClient
	}
	c.URL = strings.TrimRight(c.URL, "/")
	return nil
}

// requestBody is the chat request every arrival sends: streamed, with
// usage, exactly Tokens long where the engine can be told.
func requestBody(cfg Config) ([]byte, error) {
	req := map[string]any{
		"messages":       []map[string]string{{"role": "user", "content": cfg.Prompt}},
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
		"max_tokens":     cfg.Tokens,
		"min_tokens":     cfg.Tokens,
		"ignore_eos":     true,
	}
	if cfg.Model != "" {
		req["model"] = cfg.Model
	}
	return json.Marshal(req)
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// streamChunk is the part of a chat.completion.chunk the generator reads.
type streamChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// do sends one request and reads its stream to the end.
func do(ctx context.Context, cfg Config, body []byte) (o outcome) {
	t0 := time.Now()
	o.start = t0
	defer func() {
		o.end = time.Now()
		o.lat = o.end.Sub(t0)
		if o.err != nil && ctx.Err() != nil {
			o.unfinished = true
		}
		if o.backend == "" {
			o.backend = "unknown"
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if cfg.ResendClosed {
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%x", rand.Uint64()))
	}
	if cfg.Label != "" {
		req.Header.Set(sim.LoadHeader, cfg.Label)
	}
	// The trace tells a kept-alive connection that closed under the
	// request before any answer from a failure of the request itself.
	var conns int
	var reused, answered bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { conns++; reused = i.Reused },
		GotFirstResponseByte: func() { answered = true },
	}))
	resp, err := cfg.Client.Do(req)
	o.resent = conns > 1
	if err != nil {
		o.err = err
		if reused && !answered {
			o.err = fmt.Errorf("%w: %w", errClosedKeptAlive, err)
		}
		return o
	}
	defer resp.Body.Close()
	o.backend = resp.Header.Get(cfg.BackendHeader)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		o.err = &statusError{resp.StatusCode}
		return o
	}
	var chunks, usage int64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 16<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			o.tokens = max(chunks, usage)
			return o
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			o.tokens = chunks
			o.err = fmt.Errorf("bad chunk: %w", err)
			return o
		}
		if o.backend == "" && c.Model != "" {
			o.backend = c.Model
		}
		if c.Usage != nil {
			usage = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				if chunks == 0 {
					o.ttft = time.Since(t0)
				}
				chunks++
			}
		}
	}
	o.tokens = chunks
	o.err = errCut
	if err := sc.Err(); err != nil {
		o.err = fmt.Errorf("%w: %w", errCut, err)
	}
	return o
}

var (
	errCut             = errors.New("stream ended before [DONE]")
	errClosedKeptAlive = errors.New("kept-alive connection closed before any answer")
)

type statusError struct{ code int }

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d", e.code) }

func errorClass(err error) string {
	var se *statusError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("http_%d", se.code)
	case errors.Is(err, errCut):
		return "cut"
	case errors.Is(err, errClosedKeptAlive):
		return "closed_kept_alive"
	case strings.Contains(err.Error(), "bad chunk"):
		return "bad_chunk"
	default:
		return "transport"
	}
}

// LatencySince summarizes the latency of the completed requests sent at or
// after t, from Requests (KeepRequests): the requests that met a change
// made at t, without the steady run before it.
func (r Result) LatencySince(t time.Time) Summary {
	return Summarize(r.LatenciesSince(t))
}

// LatenciesSince are the latencies of the completed requests sent at or
// after t, in the order they were recorded.
func (r Result) LatenciesSince(t time.Time) []time.Duration {
	var ds []time.Duration
	for _, q := range r.Requests {
		if q.Outcome == "completed" && !q.Start.Before(t) {
			ds = append(ds, q.End.Sub(q.Start))
		}
	}
	return ds
}

// Summarize computes percentiles by the nearest-rank method.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{N: len(s), P50: rank(s, 0.50), P95: rank(s, 0.95), Mean: sum / time.Duration(len(s)), Max: s[len(s)-1]}
}

func rank(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
