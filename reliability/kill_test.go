package reliability

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// buildCoordinator builds the real heft-coordinator binary into a temp dir.
func buildCoordinator(t *testing.T) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("go", "build", "-o", out+string(filepath.Separator), "./coordinator/cmd/heft-coordinator")
	cmd.Dir = testutil.RepoRoot(t)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build heft-coordinator: %v\n%s", err, msg)
	}
	return filepath.Join(out, "heft-coordinator")
}

var listeningRE = regexp.MustCompile(`listening on (http://\S+)`)

// proc is one heft-coordinator process.
type proc struct {
	cmd    *exec.Cmd
	base   string
	stderr *testutil.SyncBuffer
	exited chan error

	killOnce sync.Once
}

// startProc starts the binary and waits for it to say where it listens.
// An error means the state did not open (or the process failed otherwise).
func startProc(bin, cfgPath string) (*proc, error) {
	p := &proc{cmd: exec.Command(bin, "--config", cfgPath), stderr: &testutil.SyncBuffer{}, exited: make(chan error, 1)}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listeningRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	go func() { p.exited <- p.cmd.Wait() }()
	select {
	case p.base = <-found:
		return p, nil
	case err := <-p.exited:
		return nil, fmt.Errorf("heft-coordinator exited before listening (%v): %s", err, p.stderr.String())
	case <-time.After(20 * time.Second):
		p.kill()
		return nil, fmt.Errorf("heft-coordinator did not listen within 20s: %s", p.stderr.String())
	}
}

// kill sends SIGKILL and waits for the process to be gone; it may be
// called again.
func (p *proc) kill() {
	p.killOnce.Do(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
}

// ledger is what the test knows was acknowledged, across kills.
type ledger struct {
	mu sync.Mutex
	// pins: the last weight answered 200, and the one sent without an answer.
	pinAcked, pinInFlight map[string]float64
	// measurements: every throughput sent, and every one seen in the API
	// (the fleet stores a measurement before it shows it).
	mSent, mAcked map[string]map[float64]bool
	nextTPS       map[string]float64

	pinsAcked, measAcked int // totals, for the report
}

func newLedger() *ledger {
	return &ledger{pinAcked: map[string]float64{}, pinInFlight: map[string]float64{},
		mSent: map[string]map[float64]bool{}, mAcked: map[string]map[float64]bool{}, nextTPS: map[string]float64{}}
}

// The coordinator killed with SIGKILL at a random moment while admin pins
// and probe results pour in, fifty times in a row over one state dir:
// every start must open the state, and every pin answered 200 and every
// measurement the API has shown must be there after the restart.
func TestCoordinatorSIGKILLMidWrites(t *testing.T) {
	t.Parallel() // mostly waiting: it overlaps the other waiting tests
	const kills = 50
	bin := buildCoordinator(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(t.TempDir(), "coordinator.toml")
	cfg := fmt.Sprintf("listen = \"127.0.0.1:0\"\nstate_dir = %q\nagent_token = %q\nadmin_token = %q\nlog_level = \"warn\"\napprove_new_nodes = false\n",
		dir, agentToken, adminToken)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	const node = "kill-node"
	keys := []string{node + "|vllm|a", node + "|vllm|b", node + "|vllm|c"}
	led := newLedger()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	opened := 0
	var pinsAtKill, measAtKill []int

	for i := 0; i <= kills; i++ {
		p, err := startProc(bin, cfgPath)
		if err != nil {
			t.Fatalf("start %d (after %d kills): the state did not open: %v", i+1, i, err)
		}
		t.Cleanup(p.kill) // when the test fails half-way
		opened++
		a := newAPI(p.base)
		if i > 0 {
			if err := led.verify(a, keys); err != nil {
				p.kill()
				t.Fatalf("after kill %d: %v\ncoordinator stderr:\n%s", i, err, p.stderr.String())
			}
		}
		if i == kills {
			p.kill()
			break
		}
		pins0, meas0 := led.pinsAcked, led.measAcked
		if err := hammer(p, a, node, keys, led, time.Duration(50+rng.IntN(250))*time.Millisecond); err != nil {
			t.Fatalf("iteration %d: %v\ncoordinator stderr:\n%s", i+1, err, p.stderr.String())
		}
		pinsAtKill = append(pinsAtKill, led.pinsAcked-pins0)
		measAtKill = append(measAtKill, led.measAcked-meas0)
	}
	t.Logf("%d/%d kills survived: state opened %d/%d times; %d pins and %d measurements acknowledged, 0 lost; "+
		"per kill: pins acked median %d, measurements shown median %d",
		kills, kills, opened, kills+1, led.pinsAcked, led.measAcked, median(pinsAtKill), median(measAtKill))
}

func median(xs []int) int {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// hammer connects an agent, then pins and reports measurements at full
// speed while watching the API, and SIGKILLs the process after killAfter.
func hammer(p *proc, a api, node string, keys []string, led *ledger, killAfter time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+p.base[len("http"):]+"/api/v1/agent", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
	if err != nil {
		return fmt.Errorf("agent dial: %w", err)
	}
	defer ws.CloseNow()
	send := func(payload any) error {
		data, err := wire.Encode(payload)
		if err != nil {
			return err
		}
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		defer wcancel()
		return ws.Write(wctx, websocket.MessageText, data)
	}
	host := wire.Host{Hostname: node, OS: "linux", Arch: "amd64"}
	if err := send(&wire.Hello{Node: node, AgentVersion: "reliability", Host: host}); err != nil {
		return err
	}
	snap := &wire.Snapshot{Node: node, At: time.Now().UTC(), Host: host, GPUs: []wire.GPU{}}
	for i, k := range keys {
		snap.Engines = append(snap.Engines, wire.Engine{Kind: wire.EngineVLLM, URL: fmt.Sprintf("http://127.0.0.1:%d", 8000+i),
			Model: testModel, Ready: true, CapacityKey: k})
	}
	if err := send(snap); err != nil {
		return err
	}
	go func() { // the coordinator's messages (welcome, probe requests) are read and dropped
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	// Pins need the workers to exist; from the second start they are loaded
	// from the state, the first time they come from the snapshot above.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ws, err := a.workers(ctx)
		if err == nil && len(ws) == len(keys) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("workers never appeared: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval while waiting for a state
	}

	killed := make(chan struct{})
	failed := make(chan error, 3)
	var wg sync.WaitGroup
	wg.Go(func() { // admin pins, one at a time, each weight higher than the last
		for i := 0; ; i++ {
			k := keys[i%len(keys)]
			led.mu.Lock()
			w := max(led.pinAcked[k], led.pinInFlight[k], 0.25) + 0.0001
			led.pinInFlight[k] = w
			led.mu.Unlock()
			err := a.pin(ctx, k, w)
			select {
			case <-killed:
				return // the answer (or its absence) may be the kill's doing
			default:
			}
			if err != nil {
				failed <- fmt.Errorf("pin before the kill: %w", err)
				return
			}
			led.mu.Lock()
			led.pinAcked[k], led.pinInFlight[k] = w, 0
			led.pinsAcked++
			led.mu.Unlock()
		}
	})
	wg.Go(func() { // probe results, paced under the coordinator's per-agent message rate
		for i := 0; ; i++ {
			k := keys[i%len(keys)]
			led.mu.Lock()
			tps := led.nextTPS[k] + 100
			led.nextTPS[k] = tps
			if led.mSent[k] == nil {
				led.mSent[k] = map[float64]bool{}
			}
			led.mSent[k][tps] = true
			led.mu.Unlock()
			m := measurement(k, node, tps, time.Now().UTC())
			m.Model = testModel
			if err := send(&wire.ProbeResult{Measurement: m}); err != nil {
				select {
				case <-killed:
				default:
					failed <- fmt.Errorf("probe result before the kill: %w", err)
				}
				return
			}
			select {
			case <-killed:
				return
			case <-time.After(30 * time.Millisecond):
			}
		}
	})
	wg.Go(func() { // what the API shows is acknowledged
		for {
			ws, err := a.workers(ctx)
			select {
			case <-killed:
				return
			default:
			}
			if err != nil {
				failed <- fmt.Errorf("workers before the kill: %w", err)
				return
			}
			led.mu.Lock()
			for _, k := range keys {
				for _, h := range ws[k].History {
					if led.mAcked[k] == nil {
						led.mAcked[k] = map[float64]bool{}
					}
					if !led.mAcked[k][h.ThroughputTPS] {
						led.mAcked[k][h.ThroughputTPS] = true
						led.measAcked++
					}
				}
			}
			led.mu.Unlock()
			time.Sleep(5 * time.Millisecond) // how often the ledger samples what was acknowledged
		}
	})
	time.Sleep(killAfter) // the random moment of the kill is the point of the test
	close(killed)
	p.kill()
	cancel()
	wg.Wait()
	close(failed)
	return <-failed
}

// verify checks the restarted coordinator holds everything acknowledged.
func (l *ledger) verify(a api, keys []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := a.workers(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		w, ok := ws[k]
		if !ok {
			return fmt.Errorf("worker %s is gone", k)
		}
		acked, inflight := l.pinAcked[k], l.pinInFlight[k]
		switch {
		case w.PinnedWeight == nil && acked != 0:
			return fmt.Errorf("worker %s lost its pin %g", k, acked)
		case w.PinnedWeight != nil && *w.PinnedWeight != acked && *w.PinnedWeight != inflight:
			return fmt.Errorf("worker %s is pinned at %g, want the acknowledged %g or the unanswered %g", k, *w.PinnedWeight, acked, inflight)
		}
		if w.PinnedWeight != nil {
			l.pinAcked[k] = *w.PinnedWeight // stored, so acknowledged now
		}
		l.pinInFlight[k] = 0

		var hist []float64
		for _, h := range w.History {
			if !l.mSent[k][h.ThroughputTPS] {
				return fmt.Errorf("worker %s holds a measurement of %g tok/s that was never sent", k, h.ThroughputTPS)
			}
			hist = append(hist, h.ThroughputTPS)
		}
		if !slices.IsSorted(hist) {
			return fmt.Errorf("worker %s: history out of order: %v", k, hist)
		}
		var maxAcked float64
		for v := range l.mAcked[k] {
			maxAcked = max(maxAcked, v)
			// The history keeps the newest 50; anything acknowledged inside
			// its window must be in it.
			if (len(hist) < 50 || v >= hist[0]) && !slices.Contains(hist, v) {
				return fmt.Errorf("worker %s lost the acknowledged measurement %g tok/s (history %v)", k, v, hist)
			}
		}
		if maxAcked > 0 && (w.Throughput == nil || *w.Throughput < maxAcked) {
			return fmt.Errorf("worker %s: latest throughput %v is older than the acknowledged %g", k, w.Throughput, maxAcked)
		}
		for _, v := range hist { // stored, so acknowledged now
			if l.mAcked[k] == nil {
				l.mAcked[k] = map[float64]bool{}
			}
			l.mAcked[k][v] = true
		}
	}
	return nil
}
