package probe

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 16, case 7: an engine that returns every token of a request at
// once is not a measurement of anything an engine delivers, and an
// engine's redirect is not followed to another address.
func TestImplausibleStreamsAndRedirects(t *testing.T) {
	instant := newFake(t, func(f *fakeEngine) {
		f.stream = func(_ int64, w http.ResponseWriter, _ *http.Request, req map[string]any) {
			n := intField(req, "max_tokens")
			var b strings.Builder
			for i := range n {
				fmt.Fprintf(&b, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
			}
			fmt.Fprintf(&b, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", n)
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(b.String())) // one write: every token in the same instant
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One request of 512 tokens: what bounds an instant stream's rate here
	// is the probe parsing it, and under -race sixteen streams parsed at
	// once on two cores come out near 1,500 tok/s each (no verdict on the
	// engine). One stream parses at about 30,000 tok/s under -race on a
	// loaded machine, six times the bound; without -race, sixteen do.
	m, err := Run(ctx, Config{URL: instant.URL(), Kind: "vllm", CapacityKey: "k", Tokens: 512, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("all tokens at once: %.0f tok/s, valid=%v, implausible=%q", m.ThroughputTPS, m.Valid(), m.Implausible)
	if m.Implausible == "" {
		t.Error("a stream that delivers every token in one instant was not flagged implausible")
	}

	elsewhere := newFake(t, nil)
	redirecting := newFake(t, func(f *fakeEngine) {
		f.stream = func(_ int64, w http.ResponseWriter, r *http.Request, _ map[string]any) {
			http.Redirect(w, r, elsewhere.URL()+"/v1/chat/completions", http.StatusTemporaryRedirect)
		}
	})
	m, err = Run(ctx, Config{URL: redirecting.URL(), Kind: "vllm", CapacityKey: "k"})
	followed := elsewhere.chats.Load()
	t.Logf("an engine redirecting its chat endpoint: %d requests followed to the other address; valid=%v failure=%q err=%v",
		followed, m.Valid(), m.Failure, err)
	if followed > 0 || m.Valid() {
		t.Error("the probe followed an engine's redirect to another address")
	}
}
