package reliability

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// rawAgent opens a websocket to the coordinator by hand, so that it can
// stop anywhere, even inside a frame.
func rawAgent(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	key := base64.StdEncoding.EncodeToString([]byte("reliability-key!"))
	fmt.Fprintf(conn, "GET /api/v1/agent HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n", addr, key, agentToken)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("raw upgrade: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("raw upgrade: %s", resp.Status)
	}
	return conn
}

// clientFrame is a masked text frame (the mask key is zero, so the payload
// reads as it is) whose header declares declared bytes of payload.
func clientFrame(payload []byte, declared int) []byte {
	var h []byte
	switch {
	case declared < 126:
		h = []byte{0x81, 0x80 | byte(declared)}
	default:
		h = []byte{0x81, 0x80 | 126, 0, 0}
		binary.BigEndian.PutUint16(h[2:], uint16(declared))
	}
	h = append(h, 0, 0, 0, 0)
	return append(h, payload...)
}

// Peers that stop half-way (inside an HTTP request, inside the websocket
// handshake, inside a frame, or that never read) must not stop a healthy
// agent from being measured and re-measured, nor the API and the event
// stream from answering. The real store, fleet and server; a real link.
func TestStuckPeersDoNotBlockOthers(t *testing.T) {
	t.Parallel() // mostly waiting: it overlaps the other waiting tests
	// The stuck peers stay connected until the test is done with them: a
	// ping round would drop the silent ones while the test still counts
	// them, sooner or later depending on how loaded the machine is. The
	// deaf agent is dropped for its stalled writes, not for pings.
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), func(cfg *config.Config) { cfg.Server.PingInterval = time.Hour })
	api := c.api()

	// 1. An HTTP request that never finishes its headers.
	slow, err := net.Dial("tcp", c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "GET /api/v1/workers HTTP/1.1\r\nHost: %s\r\nX-Slow: ", c.addr)

	// 2. A websocket that never says hello.
	rawAgent(t, c.addr)

	// 3. An agent stopped in the middle of a frame, after its hello.
	mid := rawAgent(t, c.addr)
	hello, err := wire.Encode(&wire.Hello{Node: "stuck-mid-frame", AgentVersion: "x", Host: wire.Host{Hostname: "stuck"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mid.Write(append(clientFrame(hello, len(hello)), clientFrame([]byte(`{"type":"snap`), 1000)...)); err != nil {
		t.Fatal(err)
	}

	// 4. An agent that never reads again (nor answers pings): on a first
	// connection it registers 32 engines and answers each probe request
	// with a valid measurement of 256 KiB (64 notes of 4 KiB), which the
	// coordinator cuts to what it keeps; on its second the coordinator
	// greets it with all 32.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const deafNode = "stuck-deaf"
	dialDeaf := func() *websocket.Conn {
		ws, _, err := websocket.Dial(ctx, c.agentURL(), &websocket.DialOptions{
			HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		return ws
	}
	send := func(ws *websocket.Conn, p any) {
		data, err := wire.Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := ws.Write(ctx, websocket.MessageText, data); err != nil {
			t.Fatal(err)
		}
	}
	snap := &wire.Snapshot{Node: deafNode, At: time.Now().UTC(), Host: wire.Host{Hostname: deafNode}}
	for i := range wire.MaxEngines {
		snap.Engines = append(snap.Engines, wire.Engine{Kind: wire.EngineVLLM, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i),
			Model: testModel, Ready: true, CapacityKey: fmt.Sprintf("%s|e%d", deafNode, i)})
	}
	notes := make([]string, wire.MaxProblemCount)
	for i := range notes {
		notes[i] = strings.Repeat("n", wire.MaxStringBytes)
	}
	first := dialDeaf()
	var cred string
	var answering sync.WaitGroup
	answering.Go(func() { // this first connection still reads, and answers its probe requests
		for {
			_, data, err := first.Read(ctx)
			if err != nil {
				return
			}
			env, err := wire.Decode(data)
			switch {
			case err != nil:
			case env.Type == wire.TypeWelcome:
				cred = env.Welcome.NodeCredential
			case env.Type == wire.TypeProbeRequest:
				m := measurement(env.ProbeRequest.CapacityKey, deafNode, 500, time.Now().UTC())
				m.Problems = notes
				send(first, &wire.ProbeResult{RequestID: env.ProbeRequest.RequestID, Measurement: m})
			}
		}
	})
	defer answering.Wait()
	send(first, &wire.Hello{Node: deafNode, AgentVersion: "x", Host: wire.Host{Hostname: deafNode}, KeepsCredential: true})
	send(first, snap)
	// Waits read the fleet in process: polling GET /api/v1/workers (166 KiB
	// here) every few milliseconds would load the machine the test times.
	// A generous deadline: under -race beside six CPU hogs (scripts/
	// test-under-load.sh) storing the 32 took longer than 20 s.
	testutil.Eventually(t, "the deaf agent's 32 measurements stored", 2*time.Minute, func() bool {
		n := 0
		for _, w := range c.Fleet().Workers() {
			if w.Node == deafNode && w.Throughput != nil {
				n++
			}
		}
		return n == wire.MaxEngines
	})
	deaf := dialDeaf() // supersedes the first; never read
	send(deaf, &wire.Hello{Node: deafNode, AgentVersion: "x", Host: wire.Host{Hostname: deafNode}, NodeCredential: cred, KeepsCredential: true})
	send(deaf, snap)

	// 5. An event stream nobody reads.
	sse, err := net.Dial("tcp", c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer sse.Close()
	fmt.Fprintf(sse, "GET /api/v1/events HTTP/1.1\r\nHost: %s\r\n\r\n", c.addr)

	testutil.Eventually(t, "the stuck agents registered", 10*time.Second, func() bool { return c.Server().AgentsConnected() == 2 })

	// Now a healthy agent: measured, pinned, re-measured on demand.
	good := newFixedAgent("healthy", 8000, 1200)
	runLink(t, c.agentURL(), good, nil)
	slowest := time.Duration(0)
	timed := func(what string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s with stuck peers connected: %v", what, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	testutil.Eventually(t, "the healthy agent measured and admitted", 20*time.Second, func() bool {
		w, _ := c.Fleet().Worker(good.key)
		return w.State == "admitted"
	})
	workersBytes := 0
	for _, path := range []string{"/api/v1/workers", "/healthz", "/metrics", "/api/v1/models/" + strings.ReplaceAll(testModel, "/", "%2F") + "/weights"} {
		timed("GET "+path, func() error {
			status, body, err := api.do(ctx, http.MethodGet, path, "", "")
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("%d %s", status, body)
			}
			if path == "/api/v1/workers" {
				workersBytes = len(body)
			}
			return err
		})
	}
	timed("pin", func() error { return api.pin(ctx, good.key, 2) })
	for _, id := range []string{deafNode + "|e0", good.key} { // the deaf one's request just waits in its queue
		timed("on-demand probe of "+id, func() error {
			status, body, err := api.do(ctx, http.MethodPost, "/api/v1/workers/"+id+"/probe", adminToken, "")
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("%d %s", status, body)
			}
			return err
		})
	}
	testutil.Eventually(t, "the on-demand measurement", 20*time.Second, func() bool {
		w, _ := c.Fleet().Worker(good.key)
		return good.probes.Load() == 2 && len(w.History) == 2
	})
	if n := c.Server().AgentsConnected(); n != 3 {
		t.Fatalf("%d agents connected, want the 2 stuck ones and the healthy one", n)
	}
	t.Logf("with 5 stuck peers connected: healthy agent measured twice; slowest API call %s; GET /api/v1/workers is %d KiB",
		slowest.Round(time.Millisecond), workersBytes>>10)

	// What the coordinator owes the deaf agent is bounded by what it keeps
	// of a measurement: the 256 KiB each one was sent as is cut to a few
	// KiB, so 32 greetings fit in the sockets' buffers and never hold the
	// coordinator up. (Past the buffers, a write that waits 10 s drops the
	// agent: coordinator/server TestStuckPeerDoesNotBlockOthers.)
	owed := 0
	for _, w := range c.Fleet().Workers() {
		if w.Node == deafNode && w.Measurement != nil {
			data, err := wire.Encode(&wire.CachedMeasurement{Measurement: *w.Measurement})
			if err != nil {
				t.Fatal(err)
			}
			owed += len(data)
		}
	}
	t.Logf("the deaf agent is owed %d KiB for 32 measurements sent as %d MiB", owed>>10, wire.MaxEngines/4)
	if owed > 1<<20 {
		t.Errorf("the deaf agent is owed %d KiB: measurements are not cut to size", owed>>10)
	}
}
