package probe

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Issue 16, case 7: an engine that returns every token of a request at
// once is not a measurement of anything an engine delivers, and an
// engine's redirect is not followed to another address.
func TestImplausibleStreamsAndRedirects(t *testing.T) {
	// In a synctest bubble the probe's clock is the fake's: a stream that
	// answers after 10 ms with all 512 tokens in one write runs at exactly
	// 51,200 tok/s however busy the machine is (on the wall clock, parsing
	// sixteen such streams under -race on two loaded cores read below the
	// 5,000 tok/s bound).
	synctest.Test(t, func(t *testing.T) {
		instant, client := bubbleFake(t, func(f *fakeEngine) {
			f.stream = func(_ int64, w http.ResponseWriter, _ *http.Request, req map[string]any) {
				n := intField(req, "max_tokens")
				var b strings.Builder
				for i := range n {
					fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
				}
				fmt.Fprintf(&b, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", n)
				w.Header().Set("Content-Type", "text/event-stream")
				time.Sleep(10 * time.Millisecond)  // the bubble's clock: a prompt's worth of work before the answer
				_, _ = w.Write([]byte(b.String())) // one write: every token in the same instant
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		m, err := Run(ctx, Config{URL: instant.URL(), HTTPClient: client, Kind: "vllm", CapacityKey: "k", Tokens: 512})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("all tokens at once: %.0f tok/s, valid=%v, implausible=%q", m.ThroughputTPS, m.Valid(), m.Implausible)
		if !strings.Contains(m.Implausible, "51200 tok/s for one stream") {
			t.Errorf("a stream that delivers every token in one instant, 10 ms after it was sent, was not flagged implausible at 51,200 tok/s: %q", m.Implausible)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	elsewhere := newFake(t, nil)
	redirecting := newFake(t, func(f *fakeEngine) {
		f.stream = func(_ int64, w http.ResponseWriter, r *http.Request, _ map[string]any) {
			http.Redirect(w, r, elsewhere.URL()+"/v1/chat/completions", http.StatusTemporaryRedirect)
		}
	})
	m, err := Run(ctx, Config{URL: redirecting.URL(), Kind: "vllm", CapacityKey: "k"})
	followed := elsewhere.chats.Load()
	t.Logf("an engine redirecting its chat endpoint: %d requests followed to the other address; valid=%v failure=%q err=%v",
		followed, m.Valid(), m.Failure, err)
	if followed > 0 || m.Valid() {
		t.Error("the probe followed an engine's redirect to another address")
	}
}
