package sim

import (
	"net/http"
	"testing"
)

func TestCloseEndsStreamsAndIsIdempotent(t *testing.T) {
	t.Parallel()
	s, err := Start(Config{SingleTPS: 200, Batch16TPS: 1600}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := post(t.Context(), s.URL(), chatBody(2000, map[string]any{"ignore_eos": true, "stream": true}))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan streamResult, 1)
	go func() { got <- readStream(resp, nil) }()
	waitFor(t, "request running", func() bool { r, _ := s.InFlight(); return r == 1 })
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if r := <-got; r.done {
		t.Errorf("stream completed although the server closed: %+v", r)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if resp, err := http.Get(s.URL() + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("server still answers after Close: %d", resp.StatusCode)
	}
}

// BenchmarkStreamedRequest measures the sim's own overhead per streamed
// request of 32 tokens, with decode steps made nearly free.
func BenchmarkStreamedRequest(b *testing.B) {
	s, err := Start(Config{SingleTPS: 1e6, Batch16TPS: 1.6e7 - 1}, "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for b.Loop() {
		resp, err := post(b.Context(), s.URL(), chatBody(32, map[string]any{"ignore_eos": true, "stream": true}))
		if err != nil {
			b.Fatal(err)
		}
		if r := readStream(resp, nil); r.tokens != 32 {
			b.Fatalf("stream: %+v", r)
		}
	}
}
