package probe

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"heft/shared/memnet"
)

// fakeEngine is a small OpenAI-style engine on 127.0.0.1 whose every
// answer can be bent, for the bad-input cases a well-behaved sim never
// shows. By default it streams exactly max_tokens chunks and true usage.
type fakeEngine struct {
	srv *httptest.Server // nil for one on an in-memory listener (bubbleFake)
	url string

	// health answers GET /health; default 200.
	health func() int
	// stream writes the answer to request n (1-based); default well-behaved.
	stream func(n int64, w http.ResponseWriter, r *http.Request, req map[string]any)

	chats atomic.Int64
	mu    sync.Mutex
	// bodies are the chat request bodies received, in arrival order.
	bodies []map[string]any
}

func newFake(t *testing.T, configure func(*fakeEngine)) *fakeEngine {
	t.Helper()
	f := &fakeEngine{}
	if configure != nil {
		configure(f)
	}
	f.srv = httptest.NewServer(f.handler())
	f.url = f.srv.URL
	t.Cleanup(f.srv.Close)
	return f
}

// bubbleFake is newFake on an in-memory listener, for a test inside a
// testing/synctest bubble (see bubbleSim): the fake's sleeps and the
// probe's clock are the bubble's. The client dials the fake.
func bubbleFake(t *testing.T, configure func(*fakeEngine)) (*fakeEngine, *http.Client) {
	t.Helper()
	f := &fakeEngine{}
	if configure != nil {
		configure(f)
	}
	ln := memnet.Listen(8000)
	srv := &http.Server{Handler: f.handler()}
	go func() { _ = srv.Serve(ln) }()
	f.url = "http://" + ln.Addr().String()
	client := ln.Client()
	t.Cleanup(func() {
		client.CloseIdleConnections()
		_ = srv.Close()
	})
	return f, client
}

func (f *fakeEngine) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusOK
		if f.health != nil {
			code = f.health()
		}
		w.WriteHeader(code)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake/model-7b","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		n := f.chats.Add(1)
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, req)
		f.mu.Unlock()
		if f.stream != nil {
			f.stream(n, w, r, req)
			return
		}
		writeStream(w, intField(req, "max_tokens"), -1)
	})
	return mux
}

func (f *fakeEngine) URL() string { return f.url }

func intField(req map[string]any, key string) int {
	v, _ := req[key].(float64)
	return int(v)
}

// writeStream streams n one-token chunks, then usage (n when usage < 0),
// then [DONE], flushing every event as a real engine does.
func writeStream(w http.ResponseWriter, n, usage int) {
	startStream(w)
	for i := range n {
		writeChunk(w, fmt.Sprintf("t%d", i))
	}
	if usage < 0 {
		usage = n
	}
	writeEvent(w, fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d}}`, usage))
	writeEvent(w, "[DONE]")
}

func startStream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	writeEvent(w, `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
}

func writeChunk(w http.ResponseWriter, text string) {
	writeEvent(w, fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":%q}}]}`, text))
}

func writeEvent(w http.ResponseWriter, data string) {
	fmt.Fprintf(w, "data: %s\n\n", data)
	_ = http.NewResponseController(w).Flush()
}
