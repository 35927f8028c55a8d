package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/shared/memnet"
)

func startSim(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// bubbleClients holds the client of each sim a test serves in memory,
// by its URL: the helpers below reach such a sim through it.
var (
	bubbleClients sync.Map // URL → *http.Client
	bubblePort    atomic.Int32
)

// bubbleSim serves a sim on an in-memory listener, for a test inside a
// testing/synctest bubble: the sim's steps and the test's clock are the
// bubble's, so what the test times is the sim's model, exactly, however
// busy the machine.
func bubbleSim(t *testing.T, cfg Config) *Server {
	t.Helper()
	ln := memnet.Listen(20000 + int(bubblePort.Add(1)))
	s, err := Serve(cfg, ln)
	if err != nil {
		t.Fatalf("serve: %v", err)
	}
	client := ln.Client()
	bubbleClients.Store(s.URL(), client)
	t.Cleanup(func() {
		bubbleClients.Delete(s.URL())
		client.CloseIdleConnections()
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// clientFor is the client that reaches url: a bubble's, or the default.
func clientFor(url string) *http.Client {
	if u, err := neturl.Parse(url); err == nil {
		if c, ok := bubbleClients.Load(u.Scheme + "://" + u.Host); ok {
			return c.(*http.Client)
		}
	}
	return http.DefaultClient
}

// fast is a calibration quick enough that lengths, not time, dominate.
func fast(flavor string) Config {
	return Config{Flavor: flavor, SingleTPS: 20000, Batch16TPS: 160000}
}

func chatBody(maxTokens int, extra map[string]any) map[string]any {
	b := map[string]any{
		"messages":   []any{map[string]any{"role": "user", "content": "count to ten please"}},
		"max_tokens": maxTokens,
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// streamResult is what a client saw of one streamed response.
type streamResult struct {
	status  int
	tokens  int   // chunks carrying content
	soFar   []int // each content chunk's usage.completion_tokens, -1 where it had none
	text    string
	finish  string
	usage   *usage // the last usage seen
	final   *usage // a usage chunk without choices (include_usage)
	done    bool   // saw data: [DONE]
	garbled int    // data lines that were not JSON
	readErr error
}

func post(ctx context.Context, url string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return clientFor(url).Do(req)
}

// readStream parses an SSE chat stream; onToken (if set) sees each token.
func readStream(resp *http.Response, onToken func(n int)) streamResult {
	defer resp.Body.Close()
	res := streamResult{status: resp.StatusCode}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			res.done = true
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			res.garbled++
			continue
		}
		if c.Usage != nil {
			res.usage = c.Usage
			if len(c.Choices) == 0 {
				res.final = c.Usage
			}
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				res.tokens++
				res.text += *ch.Delta.Content
				n := -1
				if c.Usage != nil {
					n = c.Usage.CompletionTokens
				}
				res.soFar = append(res.soFar, n)
				if onToken != nil {
					onToken(res.tokens)
				}
			}
			if ch.FinishReason != nil {
				res.finish = *ch.FinishReason
			}
		}
	}
	res.readErr = sc.Err()
	return res
}

func streamChat(t *testing.T, url string, body map[string]any) streamResult {
	t.Helper()
	body["stream"] = true
	resp, err := post(t.Context(), url, body)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	return readStream(resp, nil)
}

// nonStream is a decoded non-streamed chat response.
type nonStream struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func chat(t *testing.T, url string, body map[string]any) (int, nonStream, string) {
	t.Helper()
	resp, err := post(t.Context(), url, body)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out nonStream
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
	}
	return resp.StatusCode, out, string(raw)
}

// burst sends n concurrent exact-length streamed requests and returns the
// tokens received and the wall time from first send to last [DONE].
func burst(t *testing.T, url string, n, tokens int) (int, time.Duration) {
	t.Helper()
	results, wall := burstStreams(t, url, n, tokens, nil)
	total := 0
	for i, r := range results {
		if r.readErr != nil || !r.done || r.tokens != tokens {
			t.Fatalf("request %d: %+v", i, r)
		}
		total += r.tokens
	}
	return total, wall
}

// burstStreams sends n concurrent exact-length streamed requests, with
// extra fields in each, and returns what each stream delivered and the
// wall time from first send to last [DONE].
func burstStreams(t *testing.T, url string, n, tokens int, extra map[string]any) ([]streamResult, time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]streamResult, n)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			body := chatBody(tokens, map[string]any{"min_tokens": tokens, "stream": true})
			maps.Copy(body, extra)
			resp, err := post(t.Context(), url, body)
			if err != nil {
				results[i].readErr = err
				return
			}
			results[i] = readStream(resp, nil)
		})
	}
	wg.Wait()
	return results, time.Since(start)
}

func getBody(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := clientFor(url).Get(url)
	if err != nil {
		t.Fatalf("get %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, b
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, b := getBody(t, url)
	if code != http.StatusOK {
		t.Fatalf("get %s: %d %s", url, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v\n%s", url, err, b)
	}
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, b := getBody(t, url+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d %s", code, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%s", err, b)
	}
	return mfs
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// value finds the sample of family name whose labels include want.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range mf.GetMetric() {
		got := labelsOf(m)
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		default:
			return m.GetUntyped().GetValue()
		}
	}
	t.Fatalf("no %s sample with labels %v", name, want)
	return 0
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // generous: a loaded machine
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // poll interval while waiting for a state
	}
}

// dealt counts requests handed to ranks so far.
func dealt(s *Server) int64 {
	var n int64
	for _, r := range s.ranks {
		r.mu.Lock()
		n += r.stats.requests
		r.mu.Unlock()
	}
	return n
}

// longPrompt is one user message's text that makes a chat prompt of
// exactly tokens tokens (see textTokens: 4 template tokens around the
// message, 2 after it, one token per short word). A non-empty prefix (at
// most 8 bytes) is its first word.
func longPrompt(tokens int, prefix string) string {
	n := tokens - perMessage - genPrompt
	var b strings.Builder
	b.Grow(n * 6)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i == 0 && prefix != "" {
			b.WriteString(prefix)
			continue
		}
		b.WriteString(shortWords[i%len(shortWords)])
	}
	return b.String()
}

// shortWords are one token each.
var shortWords = strings.Fields("a long prompt is read in chunks of the step budget before its first token comes out")

// longChat is a chat body with a prompt of exactly tokens tokens and
// maxTokens max tokens.
func longChat(tokens int, prefix string, maxTokens int) map[string]any {
	return map[string]any{
		"messages":   []any{map[string]any{"role": "user", "content": longPrompt(tokens, prefix)}},
		"max_tokens": maxTokens,
	}
}

// jsonDecode reads a 200 answer's JSON body into v.
func jsonDecode(resp *http.Response, v any) error {
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
