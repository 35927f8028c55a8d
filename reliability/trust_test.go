package reliability

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/coordinator"
	"heft/coordinator/config"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// Issue 16, case 1: a stranger sending wrong tokens at 10 a second from
// the address every client shares (one NAT, one TLS proxy) must not keep
// a correct agent from connecting, nor answer a correct admin with 429.
func TestWrongTokensDoNotLockOutTheRightOnes(t *testing.T) {
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	first := newFixedAgent("lock-a", 8101, 1000)
	runLink(t, c.agentURL(), first, nil)
	testutil.Eventually(t, "the first worker admitted", 20*time.Second, func() bool {
		return mustWorkers(t, api)[first.key].State == view.StateAdmitted
	})

	// The stranger: a wrong agent token and a wrong admin token, 10 a
	// second, from 127.0.0.1 like everyone else here.
	ctx, stop := context.WithCancel(context.Background())
	var flooding sync.WaitGroup
	var wrong atomic.Int64
	flooding.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			path, method, body := "/api/v1/agent", http.MethodGet, ""
			if i%2 == 1 {
				path, method, body = "/api/v1/workers/"+first.key+"/pin", http.MethodPost, `{"weight":2}`
			}
			if _, _, err := api.do(ctx, method, path, "wrong-token-from-a-stranger", body); err == nil {
				wrong.Add(1)
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	})
	defer func() { stop(); flooding.Wait() }()
	testutil.Eventually(t, "30 wrong tokens sent", 30*time.Second, func() bool { return wrong.Load() >= 30 })

	// A correct agent connects now, and a correct admin pins, while the
	// wrong tokens keep coming.
	second := newFixedAgent("lock-b", 8102, 1100)
	start := time.Now()
	runLink(t, c.agentURL(), second, nil)
	var limited, pins int
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		status, _, err := api.do(ctx, http.MethodPost, "/api/v1/workers/"+first.key+"/pin", adminToken, `{"weight":1.5}`)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		pins++
		if status == http.StatusTooManyRequests {
			limited++
		}
	}
	connected := false
	var after time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if w := mustWorkers(t, api)[second.key]; w.AgentConnected {
			connected, after = true, time.Since(start)
			break
		}
		time.Sleep(50 * time.Millisecond) // poll interval while waiting for a state
	}
	t.Logf("wrong tokens at 10/s from one address (%d sent): correct agent connected=%v after %s; %d of %d correct admin pins answered 429",
		wrong.Load(), connected, after.Round(time.Millisecond), limited, pins)
	if !connected {
		t.Error("a correct agent could not connect while a stranger sent wrong tokens from the same address")
	}
	if limited > 0 {
		t.Errorf("%d of %d correct admin requests were answered 429", limited, pins)
	}
}

// Issue 16, case 2: a made-up node that answers its probes with 1e12
// tok/s must not take the model's weight; its workers are held with
// implausible_measurement.
func TestFakeNodeTakesNoWeight(t *testing.T) {
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	real1, real2 := newFixedAgent("real-1", 8201, 1000), newFixedAgent("real-2", 8202, 1100)
	runLink(t, c.agentURL(), real1, nil)
	runLink(t, c.agentURL(), real2, nil)
	testutil.Eventually(t, "the real workers admitted", 20*time.Second, func() bool {
		ws := mustWorkers(t, api)
		return ws[real1.key].State == view.StateAdmitted && ws[real2.key].State == view.StateAdmitted
	})

	const fakeTPS = 1e12
	fake, err := dialRogue(t, c.agentURL(), "fake-node", func(req wire.ProbeRequest) *wire.ProbeResult {
		m := measurement(req.CapacityKey, "fake-node", fakeTPS, time.Now().UTC())
		return &wire.ProbeResult{RequestID: req.RequestID, Measurement: m}
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var engines []wire.Engine
	for i := range 3 {
		key := fmt.Sprintf("fake-node|vllm|%s|%d", testModel, i)
		keys = append(keys, key)
		engines = append(engines, readyEngine(key, fmt.Sprintf("http://127.0.0.1:%d", 9900+i)))
	}
	if err := fake.hello(); err != nil {
		t.Fatal(err)
	}
	if err := fake.snapshot(nil, engines...); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the fake workers measured", 20*time.Second, func() bool {
		ws := mustWorkers(t, api)
		for _, k := range keys {
			if ws[k].Measurement == nil {
				return false
			}
		}
		return true
	})
	ws := mustWorkers(t, api)
	table := mustWeights(t, api, testModel)
	var fakeSum, total float64
	for _, e := range table.Workers {
		total += e.Weight
		if e.Node == "fake-node" {
			fakeSum += e.Weight
		}
	}
	share := 0.0
	if total > 0 {
		share = fakeSum / total
	}
	held := 0
	for _, k := range keys {
		if ws[k].State == view.StateHeld && hasWarning(ws[k], wire.CodeImplausibleMeasurement) {
			held++
		}
	}
	t.Logf("fake node's share of %s's weight: %.1f %% (%d of 3 fake workers held with implausible_measurement)", testModel, share*100, held)
	if share != 0 {
		t.Errorf("the fake node took %.1f %% of the weight", share*100)
	}
	if held != 3 {
		t.Errorf("%d of 3 fake workers held with %s", held, wire.CodeImplausibleMeasurement)
	}
}

// Issue 16, case 3: a second node claims a real worker's capacity key,
// lists its own URL for it and sends a result nobody asked for. The
// claim must be refused, the URL never reach the weight table, and the
// real worker must not keep the made-up number after the intruder leaves.
func TestNodeCannotReportForAnotherNodesWorker(t *testing.T) {
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	victim := newFixedAgent("victim", 8301, 1000)
	runLink(t, c.agentURL(), victim, nil)
	testutil.Eventually(t, "the victim admitted", 20*time.Second, func() bool {
		return mustWorkers(t, api)[victim.key].State == view.StateAdmitted
	})

	const evilURL = "http://127.0.0.1:6666"
	evil, err := dialRogue(t, c.agentURL(), "intruder", func(req wire.ProbeRequest) *wire.ProbeResult {
		m := measurement(req.CapacityKey, "intruder", 1e12, time.Now().UTC())
		return &wire.ProbeResult{RequestID: req.RequestID, Measurement: m}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := evil.hello(); err != nil {
		t.Fatal(err)
	}
	if err := evil.snapshot(nil, readyEngine(victim.key, evilURL)); err != nil {
		t.Fatal(err)
	}
	unasked := measurement(victim.key, "intruder", 1e12, time.Now().UTC())
	_ = evil.send(&wire.ProbeResult{Measurement: unasked})
	_ = evil.send(&wire.ProbeResult{RequestID: "made-up", Measurement: unasked})
	// A snapshot afterwards: once it is applied, so is everything before it.
	if err := evil.snapshot(nil, readyEngine(victim.key, evilURL)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the intruder's messages handled", 10*time.Second, func() bool {
		ws := mustWorkers(t, api)
		return ws[victim.key].Node == "intruder" || (ws[victim.key].Node == victim.node && len(c.Fleet().Workers()) > 0 && c.Server().AgentsConnected() == 2)
	})
	inTable := false
	for _, e := range mustWeights(t, api, testModel).Workers {
		if e.URL == evilURL {
			inTable = true
		}
	}
	_ = evil.ws.CloseNow()
	testutil.Eventually(t, "the intruder gone", 10*time.Second, func() bool { return c.Server().AgentsConnected() == 1 })
	w := mustWorkers(t, api)[victim.key]
	tps := -1.0
	if w.Throughput != nil {
		tps = *w.Throughput
	}
	t.Logf("intruder's URL in the weight table: %v; the victim's worker after the intruder left: node %s, throughput %.4g tok/s (its own: %.4g)",
		inTable, w.Node, tps, victim.tps)
	if inTable {
		t.Error("the intruder's URL reached the weight table")
	}
	if w.Node != victim.node || tps != victim.tps {
		t.Errorf("the victim's worker is on node %q at %.4g tok/s, want %q at %.4g", w.Node, tps, victim.node, victim.tps)
	}
}

// Issue 16, case 4: an agent saying hello with an existing node's name
// and no engines, again and again. The real node's worker must stay in
// the weight table and its connection undisturbed; each impostor is
// refused with a close reason.
func TestNodeNameImpostorIsRefused(t *testing.T) {
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	real := newFixedAgent("gpu-a", 8401, 1000)
	runLink(t, c.agentURL(), real, nil)
	testutil.Eventually(t, "the real worker admitted", 20*time.Second, func() bool {
		return mustWorkers(t, api)[real.key].State == view.StateAdmitted
	})
	const tries = 5
	refused, outOfTable := 0, 0
	var reason string
	for range tries {
		imp, err := dialRogue(t, c.agentURL(), real.node, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = imp.hello()
		_ = imp.snapshot(nil)
		code, why := imp.closeStatus(2 * time.Second)
		if code == wire.CloseNodeCredential {
			refused++
			reason = why
		}
		in := false
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		table, _ := api.weights(ctx, testModel) // 404 once the model has no worker
		cancel()
		for _, e := range table.Workers {
			in = in || e.ID == real.key
		}
		if !in {
			outOfTable++
		}
		_ = imp.ws.CloseNow()
	}
	sessions := len(real.sessionsSince(time.Time{}))
	t.Logf("impostor of node %s, %d tries: %d refused (%q); the real worker out of the weight table after %d; the real agent had %d sessions",
		real.node, tries, refused, reason, outOfTable, sessions)
	if refused != tries || outOfTable != 0 || sessions != 1 {
		t.Errorf("want every impostor refused, the real worker always in the table and one session of the real agent")
	}
}

// Issue 16, case 5: one connection listing new capacity keys and
// answering every probe with a measurement near the message limit; a
// snapshot of 32 engines without GPU UUIDs on a host of 64 GPUs; an event
// stream that follows it all. Memory, the state file, the API and the
// events must stay bounded.
func TestAgentInputStaysBounded(t *testing.T) {
	dir := t.TempDir()
	// The flood is 32 results of ~700 kB at once; the coordinator reads
	// and stores them one after another, and the rogue's pong waits
	// behind them in the stream. Under -race on a loaded machine that
	// took past the 5 s ping timeout and the coordinator dropped the
	// rogue (reason=ping_timeout) before the bounds were reached; this
	// test is about what is kept, so pings wait a minute here.
	c := startCoord(t, dir, "127.0.0.1:0", quietLogger(t), func(cfg *config.Config) { cfg.Server.PingTimeout = time.Minute })
	api := c.api()
	// A quiet node elsewhere, whose worker must not be re-sent with every
	// change of the flooding one.
	other := newFixedAgent("quiet", 8501, 1000)
	runLink(t, c.agentURL(), other, nil)
	testutil.Eventually(t, "the quiet worker admitted", 20*time.Second, func() bool {
		return mustWorkers(t, api)[other.key].State == view.StateAdmitted
	})
	events := followEvents(t, "http://"+c.addr)
	base := heapMB()

	big := func(key string) *wire.ProbeResult {
		m := measurement(key, "grow", 1000, time.Now().UTC())
		for range wire.MaxProblemCount {
			m.Problems = append(m.Problems, strings.Repeat("p", wire.MaxStringBytes-64))
		}
		for range 40 {
			m.ClockEventReasons = append(m.ClockEventReasons, strings.Repeat("r", wire.MaxStringBytes-64))
		}
		return &wire.ProbeResult{Measurement: m}
	}
	g, err := dialRogue(t, c.agentURL(), "grow", func(req wire.ProbeRequest) *wire.ProbeResult {
		r := big(req.CapacityKey)
		r.RequestID = req.RequestID
		return r
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.hello(); err != nil {
		t.Fatal(err)
	}
	const rounds = 8
	sent := 0
	for round := range rounds {
		var engines []wire.Engine
		for i := range wire.MaxEngines {
			engines = append(engines, readyEngine(fmt.Sprintf("grow-%d-%d", round, i), fmt.Sprintf("http://127.0.0.1:%d", 10000+i)))
		}
		if err := g.snapshot(nil, engines...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		sent += len(engines)
		testutil.Eventually(t, "the round's probe requests answered", 30*time.Second, func() bool {
			return len(g.probeRequests()) >= sent || closed(g)
		})
		if closed(g) {
			break
		}
		// The attacker keeps to the coordinator's message rate (50 a
		// second after a burst of 100): what it meets is then the bounds
		// on what is kept, not the rate limit closing it.
		time.Sleep(time.Second)
	}
	// 32 engines, no GPU UUIDs, on a host of 64 GPUs with long names.
	gpus := make([]wire.GPU, wire.MaxGPUs)
	for i := range gpus {
		gpus[i] = wire.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: strings.Repeat("n", 12000/wire.MaxGPUs*10)}
	}
	var wide []wire.Engine
	for i := range wire.MaxEngines {
		wide = append(wide, readyEngine(fmt.Sprintf("wide-%d", i), fmt.Sprintf("http://127.0.0.1:%d", 11000+i)))
	}
	wideNode, err := dialRogue(t, c.agentURL(), "wide", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = wideNode.hello()
	_ = wideNode.snapshot(gpus, wide...)
	testutil.Eventually(t, "the wide node's workers listed", 20*time.Second, func() bool {
		return mustWorkers(t, api)["wide-0"].ID != ""
	})
	// Heartbeats of the wide node: each is one node's change.
	mark := events.count()
	for range 3 {
		_ = wideNode.snapshot(gpus, wide...)
	}
	_ = g.ws.CloseNow()
	_ = wideNode.ws.CloseNow()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, body, err := api.do(ctx, http.MethodGet, "/api/v1/workers", "", "")
	if err != nil {
		t.Fatal(err)
	}
	growth := heapMB() - base
	info, err := os.Stat(filepath.Join(dir, "heft.db"))
	if err != nil {
		t.Fatal(err)
	}
	stateMB := float64(info.Size()) / (1 << 20)
	testutil.Eventually(t, "an event after the heartbeats", 10*time.Second, func() bool { return events.count() > mark })
	maxEvent := events.maxSince(mark)
	resent := events.mentionSince(mark, other.key)
	t.Logf("after %d new capacity keys with ~%d kB measurements and a 32-engine × 64-GPU snapshot: heap +%.0f MB, state file %.1f MB, "+
		"GET /api/v1/workers %.1f MB, largest event after a heartbeat %.1f kB",
		sent, wire.MaxMessageBytes/1000*2/3, growth, stateMB, float64(len(body))/(1<<20), float64(maxEvent)/1000)
	if growth > 64 || stateMB > 32 || len(body) > 8<<20 {
		t.Errorf("unbounded: heap +%.0f MB (want ≤ 64), state file %.1f MB (want ≤ 32), workers %d bytes (want ≤ 8 MiB)", growth, stateMB, len(body))
	}
	if resent > 0 {
		t.Errorf("%d events after other nodes' heartbeats re-sent the quiet node's unchanged worker: the stream re-sends the fleet "+
			"(largest %d bytes, the whole fleet %d)", resent, maxEvent, len(body))
	}
}

func closed(r *rogue) bool {
	select {
	case <-r.closed:
		return true
	default:
		return false
	}
}

// heapMB is the live heap after a collection, in MB. Two collections:
// sync.Pool caches survive the first.
func heapMB() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// eventLog follows /api/v1/events and keeps each event's size, and the
// text of the last few.
type eventLog struct {
	mu    sync.Mutex
	sizes []int
	texts map[int]string
}

// mentionSince counts the events from i on whose text holds s.
func (l *eventLog) mentionSince(i int, s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for j := i; j < len(l.sizes); j++ {
		if strings.Contains(l.texts[j], s) {
			n++
		}
	}
	return n
}

func (l *eventLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sizes)
}

func (l *eventLog) maxSince(i int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := 0
	for _, s := range l.sizes[i:] {
		m = max(m, s)
	}
	return m
}

func followEvents(t *testing.T, base string) *eventLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &eventLog{texts: map[int]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1<<20)
		size := 0
		pending := []byte{}
		for {
			n, err := resp.Body.Read(buf)
			pending = append(pending, buf[:n]...)
			for {
				i := strings.Index(string(pending), "\n\n")
				if i < 0 {
					break
				}
				chunk := pending[:i]
				pending = pending[i+2:]
				size += len(chunk)
				if !strings.HasPrefix(string(chunk), ":") {
					l.mu.Lock()
					l.texts[len(l.sizes)] = string(chunk)
					delete(l.texts, len(l.sizes)-64)
					l.sizes = append(l.sizes, size)
					l.mu.Unlock()
				}
				size = 0
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	return l
}

// Issue 16, case 6: a changed digit inside the state file must not load
// silently, and a 0-byte state file must not start blank.
func TestStateFileDamageIsNotServed(t *testing.T) {
	dir := t.TempDir()
	c := startCoord(t, dir, "127.0.0.1:0", quietLogger(t), nil)
	api := c.api()
	a := newFixedAgent("pinned", 8601, 1000)
	runLink(t, c.agentURL(), a, nil)
	testutil.Eventually(t, "the worker admitted", 20*time.Second, func() bool {
		return mustWorkers(t, api)[a.key].State == view.StateAdmitted
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := api.pin(ctx, a.key, 5.131); err != nil {
		t.Fatal(err)
	}
	c.stop()

	path := filepath.Join(dir, "heft.db")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Copy-on-write leaves older copies of the page in the file: change
	// every one.
	n := strings.Count(string(data), "5.131")
	if n == 0 {
		t.Fatal("the pin's digits are not in the state file")
	}
	data = []byte(strings.ReplaceAll(string(data), "5.131", "7.131"))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	pin := "none"
	if co, err := coordNew(dir); err != nil {
		pin = "refused: " + err.Error()
	} else {
		if w, ok := co.Fleet().Worker(a.key); ok && w.PinnedWeight != nil {
			pin = fmt.Sprint(*w.PinnedWeight)
		}
		_ = co.Close()
	}
	t.Logf("pin 5.131 changed to 7.131 on disk: loaded as %s", pin)
	if pin == "7.131" {
		t.Error("a changed digit in the state file loaded without a word")
	}

	// A 0-byte file where the state was.
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	co, err := coordNew(dir)
	if err == nil {
		_ = co.Close()
	}
	t.Logf("0-byte state file: start refused=%v (%v)", err != nil, err)
	if err == nil {
		t.Error("a 0-byte state file started blank, dropping every pin")
	}
	if info, _ := os.Stat(path); info == nil || info.Size() != 0 {
		t.Error("the refused 0-byte file was written to")
	}
}

// helloOnce connects, says hello and an empty snapshot, and leaves once
// welcomed; it returns the close code when refused instead (0 when
// welcomed). It keeps nothing, so the test's own memory does not count.
func helloOnce(url string, h *wire.Hello) (websocket.StatusCode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		return 0, err
	}
	defer ws.CloseNow()
	for _, payload := range []any{h, &wire.Snapshot{Node: h.Node, GPUs: []wire.GPU{}}} {
		data, err := wire.Encode(payload)
		if err != nil {
			return 0, err
		}
		if err := ws.Write(ctx, websocket.MessageText, data); err != nil {
			break // refused already
		}
	}
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return websocket.CloseStatus(err), nil
		}
		if env, err := wire.Decode(data); err == nil && env.Type == wire.TypeWelcome {
			return 0, nil
		}
	}
}

// coordNew builds (not runs) a coordinator over dir.
func coordNew(dir string) (*coordinator.Coordinator, error) {
	cfg := config.Default()
	cfg.Listen, cfg.StateDir = "127.0.0.1:0", dir
	cfg.AgentToken, cfg.AdminToken = agentToken, adminToken
	return coordinator.New(cfg)
}

// Issue 16, case 8: the smaller items. A 1-character token is refused at
// start; the dashboard and API answer with CSP, frame-ancestors, nosniff
// and Referrer-Policy; connections past a kind's cap are refused.
func TestSmallerHardening(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	cfg.AgentToken, cfg.AdminToken = "a", adminToken
	_, err := coordinator.New(cfg)
	t.Logf("1-character agent token: refused=%v (%v)", err != nil, err)
	if err == nil {
		t.Error("a 1-character agent token was accepted")
	}

	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var missing []string
	for _, path := range []string{"/", "/api/v1/workers"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		h := resp.Header
		for _, want := range []struct{ header, has string }{
			{"Content-Security-Policy", "frame-ancestors 'none'"},
			{"Content-Security-Policy", "default-src 'self'"},
			{"X-Content-Type-Options", "nosniff"},
			{"Referrer-Policy", "no-referrer"},
		} {
			if !strings.Contains(h.Get(want.header), want.has) {
				missing = append(missing, fmt.Sprintf("%s %s: %s", path, want.header, want.has))
			}
		}
	}
	t.Logf("missing security headers: %d %v", len(missing), missing)
	if len(missing) > 0 {
		t.Error("security headers missing")
	}
}

// Issue 16, case 5 (node names): hellos with new node names and the
// largest host facts the wire allows, each from a connection that then
// leaves. What the coordinator keeps per name must be small, and bounded
// by max_nodes.
func TestManyNodeNamesStayBounded(t *testing.T) {
	const hellos, maxNodes = 1000, 600
	c := startCoord(t, t.TempDir(), "127.0.0.1:0", quietLogger(t), func(cfg *config.Config) { cfg.Nodes.MaxNodes, cfg.Nodes.MaxPending = maxNodes, 100 })
	base := heapMB()
	big := strings.Repeat("h", wire.MaxStringBytes)
	refused := 0
	for i := range hellos {
		host := wire.Host{Hostname: big, OS: big, Platform: big, PlatformVersion: big, KernelVersion: big, Arch: big, CPUModel: big}
		code, err := helloOnce(c.agentURL(), &wire.Hello{Node: fmt.Sprintf("ghost-%05d", i), AgentVersion: big, Host: host, KeepsCredential: true})
		if err != nil {
			t.Fatal(err)
		}
		if code == wire.CloseLimit {
			refused++
		}
	}
	testutil.Eventually(t, "every ghost gone", 10*time.Second, func() bool { return c.Server().AgentsConnected() == 0 })
	growth := heapMB() - base
	st := c.Fleet().Stats()
	if p := os.Getenv("HEFT_HEAP_PROFILE"); p != "" {
		f, _ := os.Create(p)
		_ = pprof.WriteHeapProfile(f)
		f.Close()
	}
	t.Logf("%d hellos with new names and %d kB of host facts each: heap +%.1f MB (%.0f bytes a name), %d refused at max_nodes %d, %d nodes in the fleet",
		hellos, 7*wire.MaxStringBytes/1000, growth, growth*(1<<20)/hellos, refused, maxNodes, st.Nodes)
	// A ghost leaves before it acknowledges its credential, so its name is
	// taken back (nodes.Registry.Delivered) and none reaches max_nodes; the
	// bound that matters is what stays: names kept, fleet nodes, heap.
	kept := ghostNamesKept(t, c)
	t.Logf("names kept: %d", kept)
	if kept > maxNodes || refused > hellos-maxNodes || st.Nodes != 0 || growth > 8 {
		t.Errorf("want at most %d names kept, at most %d refused, 0 nodes left in the fleet and at most 8 MB kept; got %d, %d, %d, %.1f MB",
			maxNodes, hellos-maxNodes, kept, refused, st.Nodes, growth)
	}
}

// ghostNamesKept counts the ghost names in the coordinator's node records.
func ghostNamesKept(t *testing.T, c *coord) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+c.addr+"/api/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("node list: %d %v", resp.StatusCode, err)
	}
	return strings.Count(string(body), `"ghost-`)
}
