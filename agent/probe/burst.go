package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"heft/agent/engine"
	"heft/shared/wire"
)

// continuousUsage asks vLLM and SGLang for the tokens so far in every
// streamed chunk.
const continuousUsage = "continuous_usage_stats"

// requestBody builds the chat request every request of a burst sends:
// max_tokens = tokens plus the fields with which the engine's kind is told
// an exact length (engine.OutputFor; reference/engines.md §6), and usage
// in every chunk where the kind gives it.
func requestBody(form engine.OutputForm, model, prompt string, tokens int) ([]byte, error) {
	opts := map[string]bool{"include_usage": true}
	if form.ContinuousUsage {
		opts[continuousUsage] = true
	}
	req := map[string]any{
		"model":          model,
		"messages":       []map[string]string{{"role": "user", "content": prompt}},
		"stream":         true,
		"stream_options": opts,
		"max_tokens":     tokens,
	}
	if form.Fields != nil {
		for k, v := range form.Fields(tokens) {
			req[k] = v
		}
	}
	return json.Marshal(req)
}

// reqResult is what one request of a burst saw.
type reqResult struct {
	Sent  time.Time
	Stats streamStats
	Err   error
}

// counters are the live progress of a burst, read by the reporter.
type counters struct {
	// tokens counts the completion tokens received so far: by the usage
	// in each chunk where the engine sends it, else a token a chunk.
	done, tokens atomic.Int64
	// prompt counts the prompt tokens of finished requests, by usage.
	prompt atomic.Int64
}

// runBurst sends one streamed request per body, all at once, and waits for
// all of them. It never cancels the others when one fails, so the result
// can say how many failed; ctx bounds the whole burst.
func runBurst(ctx context.Context, client *http.Client, url string, bodies [][]byte, c *counters) []reqResult {
	results := make([]reqResult, len(bodies))
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i] = doRequest(ctx, client, url, bodies[i], c)
			c.done.Add(1)
		})
	}
	wg.Wait()
	return results
}

// answerError is an engine's answer other than 200: its status and the
// start of its body, which says why (a context limit, for one).
type answerError struct {
	status string
	code   int
	body   string
}

func (e *answerError) Error() string { return fmt.Sprintf("engine answered %s: %s", e.status, e.body) }

func doRequest(ctx context.Context, client *http.Client, url string, body []byte, c *counters) reqResult {
	var res reqResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	res.Sent = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.Err = err
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		loc := resp.Header.Get("Location")
		res.Err = fmt.Errorf("engine answered %s, redirecting to %q: the probe measures the engine at its configured URL and does not follow redirects",
			resp.Status, clip(loc))
		return res
	}
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		res.Err = &answerError{status: resp.Status, code: resp.StatusCode, body: wire.Clip(strings.TrimSpace(string(snippet)), 400)}
		return res
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Err = fmt.Errorf("engine answered %q, not an event stream: %s", resp.Header.Get("Content-Type"), clip(strings.TrimSpace(string(snippet))))
		return res
	}
	res.Stats, res.Err = readChat(resp.Body, time.Now, func(n int) { c.tokens.Add(int64(n)) })
	if res.Err == nil && res.Stats.HasPromptUsage {
		c.prompt.Add(int64(res.Stats.PromptUsage))
	}
	return res
}

// burstSummary judges one burst.
type burstSummary struct {
	Requests, Failed int
	// Tokens counts completion tokens: usage where reported, else chunks.
	Tokens int
	Wall   time.Duration
	TPS    float64
	// Short is true when any request came back with other than the asked
	// number of tokens, without usage, or with fewer tokens by usage than
	// chunks of text in its stream.
	Short bool
	// Errors and Shortfalls describe failed and short requests, grouped.
	Errors, Shortfalls []string
	Decode, TTFT       []float64
	// Fastest is the request that delivered its tokens at the highest
	// rate, from its sending to its last token: what one stream did.
	Fastest streamRate
	// Refusals are the bodies of the engine's 4xx answers: why it refused
	// a request.
	Refusals []string
}

// refused says whether the engine refused a request naming field.
func (s burstSummary) refused(field string) bool {
	return slices.ContainsFunc(s.Refusals, func(body string) bool { return strings.Contains(body, field) })
}

// streamRate is one request's tokens over its whole time, sending to last
// token: a buffering proxy in front of an engine delays tokens but cannot
// shorten this.
type streamRate struct {
	Request  int // 1-based
	Tokens   int
	Duration time.Duration
	TPS      float64       // +Inf for tokens in no time at all
	Span     time.Duration // from its first token to its last
}

// summarize counts a burst's tokens, from the first request sent to the
// last token received, and says what went wrong with which requests.
func summarize(results []reqResult, want int) burstSummary {
	s := burstSummary{Requests: len(results)}
	var start, end time.Time
	errs, short := newGrouper(len(results)), newGrouper(len(results))
	for i, r := range results {
		if !r.Sent.IsZero() && (start.IsZero() || r.Sent.Before(start)) {
			start = r.Sent
		}
		if r.Err != nil {
			s.Failed++
			errs.add(errorClass(r.Err), fmt.Sprintf("request %d: %v", i+1, r.Err))
			if ae := (*answerError)(nil); errors.As(r.Err, &ae) && ae.code >= 400 && ae.code < 500 {
				s.Refusals = append(s.Refusals, ae.body)
			}
			continue
		}
		st := r.Stats
		got := st.Chunks
		if st.HasUsage {
			got = st.Usage
		}
		s.Tokens += got
		if st.LastToken.After(end) {
			end = st.LastToken
		}
		switch {
		case !st.HasUsage:
			short.add("no usage", fmt.Sprintf("request %d: the engine reported no usage (%d chunks streamed)", i+1, st.Chunks))
		case st.Usage < st.Chunks:
			// Each chunk of text carries one token or more (speculative
			// decoding streams a step's accepted tokens together).
			short.add("disagree", fmt.Sprintf("request %d: usage says %d tokens but the stream carried %d chunks of text", i+1, st.Usage, st.Chunks))
		}
		switch {
		case got < want:
			short.add("fewer", fmt.Sprintf("request %d: %d tokens, asked for %d", i+1, got, want))
		case got > want:
			short.add("more", fmt.Sprintf("request %d: %d tokens, asked for exactly %d", i+1, got, want))
		}
		if !st.FirstToken.IsZero() {
			s.TTFT = append(s.TTFT, st.FirstToken.Sub(r.Sent).Seconds())
		}
		if got > 1 && !st.LastToken.IsZero() {
			d := st.LastToken.Sub(r.Sent)
			rate := math.Inf(1)
			if d > 0 {
				rate = float64(got) / d.Seconds()
			}
			if rate > s.Fastest.TPS {
				s.Fastest = streamRate{Request: i + 1, Tokens: got, Duration: d, TPS: rate, Span: st.LastToken.Sub(st.FirstToken)}
			}
		}
		// Its decode rate: the tokens after its first chunk (the prompt's
		// step gives one) over the time from that chunk to its last.
		if d := st.LastToken.Sub(st.FirstToken).Seconds(); st.Chunks > 1 && d > 0 {
			s.Decode = append(s.Decode, float64(got-1)/d)
		}
	}
	if s.Tokens > 0 && end.After(start) {
		s.Wall = end.Sub(start)
		s.TPS = float64(s.Tokens) / s.Wall.Seconds()
	}
	s.Errors, s.Shortfalls = errs.lines(), short.lines()
	s.Short = len(s.Shortfalls) > 0
	return s
}

// errorClass groups request errors so sixteen identical failures read as
// one line.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, errDropped):
		return "dropped"
	case errors.Is(err, errMalformedSSE):
		return "malformed"
	}
	msg := err.Error()
	if i := strings.Index(msg, ": "); i > 0 && strings.HasPrefix(msg, "engine answered") {
		return msg[:i]
	}
	return "other"
}

// grouper collects messages by class, keeping a count and the first
// example of each, so Problems stay short and bounded.
type grouper struct {
	total int
	order []string
	count map[string]int
	first map[string]string
}

func newGrouper(total int) *grouper {
	return &grouper{total: total, count: map[string]int{}, first: map[string]string{}}
}

func (g *grouper) add(class, msg string) {
	if g.count[class] == 0 {
		g.order = append(g.order, class)
		g.first[class] = msg
	}
	g.count[class]++
}

const maxGroups = 8

func (g *grouper) lines() []string {
	var out []string
	for i, class := range g.order {
		if i == maxGroups {
			out = append(out, fmt.Sprintf("and %d more kinds of problem", len(g.order)-maxGroups))
			break
		}
		if n := g.count[class]; n > 1 {
			out = append(out, fmt.Sprintf("%d of %d requests like %s", n, g.total, g.first[class]))
		} else {
			out = append(out, g.first[class])
		}
	}
	return out
}

// percentile returns the nearest-rank p-quantile (0 < p <= 1) of xs, or 0.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(float64(len(s))*p)) - 1
	return s[max(0, min(i, len(s)-1))]
}
