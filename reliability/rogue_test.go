package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/view"
	"heft/shared/wire"
)

// rogue is an agent driven by hand over a real websocket: it holds the
// agent token and says whatever a test wants, as an attacker who copied
// the token from any host would.
type rogue struct {
	t    *testing.T
	node string
	ws   *websocket.Conn
	// onProbe answers a probe request; nil leaves requests unanswered.
	onProbe func(req wire.ProbeRequest) *wire.ProbeResult

	sending sync.WaitGroup
	// writeMu lets one message out at a time, so that each write's
	// deadline covers its own message and not a queue of others: 32 probe
	// results of ~700 kB, written at once under a 10 s deadline each, ran
	// out of time on a loaded machine and the cut write ended the
	// connection (TestAgentInputStaysBounded, "use of closed network
	// connection").
	writeMu sync.Mutex

	mu       sync.Mutex
	welcome  *wire.Welcome
	requests []wire.ProbeRequest
	closed   chan struct{}
	closeErr error
}

// dialRogue connects with the agent token and starts reading. A refused
// upgrade is returned as an error with the HTTP status.
func dialRogue(t *testing.T, url, node string, onProbe func(wire.ProbeRequest) *wire.ProbeResult) (*rogue, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial: %s: %w", resp.Status, err)
		}
		return nil, err
	}
	ws.SetReadLimit(wire.MaxMessageBytes)
	r := &rogue{t: t, node: node, ws: ws, onProbe: onProbe, closed: make(chan struct{})}
	go r.read()
	t.Cleanup(func() { r.ws.CloseNow(); <-r.closed; r.sending.Wait() })
	return r, nil
}

func (r *rogue) read() {
	defer close(r.closed)
	for {
		_, data, err := r.ws.Read(context.Background())
		if err != nil {
			r.mu.Lock()
			r.closeErr = err
			r.mu.Unlock()
			return
		}
		env, err := wire.Decode(data)
		if err != nil {
			continue
		}
		switch env.Type {
		case wire.TypeWelcome:
			r.mu.Lock()
			r.welcome = env.Welcome
			r.mu.Unlock()
		case wire.TypeProbeRequest:
			r.mu.Lock()
			r.requests = append(r.requests, *env.ProbeRequest)
			r.mu.Unlock()
			if r.onProbe != nil {
				if res := r.onProbe(*env.ProbeRequest); res != nil {
					// Sent aside, so that the reader keeps reading (and
					// answering pings) while big results go out.
					r.sending.Go(func() { _ = r.send(res) })
				}
			}
		}
	}
}

// send writes one message; errors after the peer closed are returned.
func (r *rogue) send(payload any) error {
	data, err := wire.Encode(payload)
	if err != nil {
		return err
	}
	r.writeMu.Lock()
	defer r.writeMu.Unlock()
	// A generous bound: a message up to wire.MaxMessageBytes read and
	// checked by a coordinator under -race on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return r.ws.Write(ctx, websocket.MessageText, data)
}

func (r *rogue) hello() error {
	return r.send(&wire.Hello{Node: r.node, AgentVersion: "rogue", Host: wire.Host{Hostname: r.node, OS: "linux", Arch: "amd64"}})
}

// snapshot lists engines as the rogue's own.
func (r *rogue) snapshot(gpus []wire.GPU, engines ...wire.Engine) error {
	if gpus == nil {
		gpus = []wire.GPU{}
	}
	return r.send(&wire.Snapshot{Node: r.node, At: time.Now().UTC(), Host: wire.Host{Hostname: r.node, OS: "linux", Arch: "amd64"},
		GPUs: gpus, Engines: engines})
}

// closeStatus waits up to d for the coordinator to end the connection and
// returns its close code and reason; -1 when it did not close it.
func (r *rogue) closeStatus(d time.Duration) (websocket.StatusCode, string) {
	select {
	case <-r.closed:
	default:
		select {
		case <-r.closed:
		case <-time.After(d):
			return -1, ""
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var ce websocket.CloseError
	if errors.As(r.closeErr, &ce) {
		return ce.Code, ce.Reason
	}
	return -1, fmt.Sprint(r.closeErr)
}

func (r *rogue) probeRequests() []wire.ProbeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]wire.ProbeRequest(nil), r.requests...)
}

// readyEngine is a ready vLLM engine of testModel with a capacity key.
func readyEngine(key, url string) wire.Engine {
	return wire.Engine{Kind: wire.EngineVLLM, URL: url, Model: testModel, Ready: true, CapacityKey: key, Load: wire.Load{Known: true}}
}

// weights is GET /api/v1/models/{model}/weights.
func (a api) weights(ctx context.Context, model string) (view.Weights, error) {
	status, body, err := a.do(ctx, http.MethodGet, "/api/v1/models/"+model+"/weights", "", "")
	if err != nil {
		return view.Weights{}, err
	}
	if status != http.StatusOK {
		return view.Weights{}, fmt.Errorf("GET weights of %s: %d %s", model, status, body)
	}
	var w view.Weights
	return w, json.Unmarshal(body, &w)
}

func mustWeights(t *testing.T, a api, model string) view.Weights {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := a.weights(ctx, model)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
