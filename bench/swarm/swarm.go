// Package swarm simulates a fleet of heft agents for the coordinator scale
// benchmark: each simulated agent is one websocket connection that says
// hello, reports one ready engine in a snapshot every few seconds, and
// answers the coordinator's probe requests with a plausible measurement.
// It measures how long a snapshot takes to become visible in the API.
//
// It speaks the real wire protocol (heft/shared/wire) over real websockets,
// so the coordinator cannot tell it from a fleet of agents that never probe
// an engine.
package swarm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"heft/shared/wire"
)

// Config shapes a swarm.
type Config struct {
	URL   string // the coordinator's agent endpoint, ws://host:port/api/v1/agent
	API   string // the coordinator's HTTP base, http://host:port
	Token string // the agent token

	Agents int    // simulated agents, one engine each
	Models int    // engines are spread over this many models; default 10
	Prefix string // node name prefix; default "swarm"

	// SnapshotEvery is each agent's heartbeat; default 5s. The first
	// heartbeat of each agent falls at a random phase so the load is even.
	SnapshotEvery time.Duration
	// DialConcurrency bounds connection attempts in flight; default 32.
	DialConcurrency int
	// DialTimeout bounds one connection attempt; default 30s.
	DialTimeout time.Duration
}

func (c *Config) normalize() error {
	if c.Agents < 1 {
		return fmt.Errorf("swarm: agents must be at least 1, got %d", c.Agents)
	}
	for name, raw := range map[string]string{"url": c.URL, "api": c.API} {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return fmt.Errorf("swarm: %s %q is not a URL", name, raw)
		}
	}
	if c.Token == "" {
		return errors.New("swarm: no agent token")
	}
	if c.Models <= 0 {
		c.Models = 10
	}
	if c.Prefix == "" {
		c.Prefix = "swarm"
	}
	if c.SnapshotEvery <= 0 {
		c.SnapshotEvery = 5 * time.Second
	}
	if c.DialConcurrency <= 0 {
		c.DialConcurrency = 32
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 30 * time.Second
	}
	c.API = strings.TrimSuffix(c.API, "/")
	return nil
}

// Stats are the swarm's counters.
type Stats struct {
	Open          int64 `json:"open"`           // connections open now
	Dropped       int64 `json:"dropped"`        // connections that ended before Close
	Reconnects    int64 `json:"reconnects"`     // connections made again after a drop
	Snapshots     int64 `json:"snapshots"`      // snapshots sent
	ProbeRequests int64 `json:"probe_requests"` // probe requests received
	Measured      int64 `json:"measured"`       // agents that have sent a measurement or got a cached one
	Cached        int64 `json:"cached"`         // cached measurements received
}

// Swarm is a running set of simulated agents.
type Swarm struct {
	cfg    Config
	agents []*agent
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	client *http.Client

	open, dropped, reconnects, snapshots, probeReqs, measured, cached atomic.Int64

	allMeasured  chan struct{}
	measuredOnce sync.Once
}

// agent is one simulated node with one engine. Like the real agent, it
// reconnects with a growing, jittered backoff when its connection drops.
type agent struct {
	s    *Swarm
	node string
	key  string
	seq  atomic.Int64 // stamped into Load.Running
	msgs AgentMessages
	once sync.Once // first measurement counted once

	mu   sync.Mutex // guards conn and snap, and orders writes
	conn *websocket.Conn
	snap wire.Snapshot
}

// Start connects every agent (at most DialConcurrency dials at a time),
// each sending hello and a first snapshot, and starts their heartbeats.
// It returns once every agent is connected, or with the first error.
func Start(ctx context.Context, cfg Config) (*Swarm, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 16
	s := &Swarm{
		cfg: cfg, ctx: sctx, cancel: cancel,
		client:      &http.Client{Transport: tr, Timeout: time.Minute},
		allMeasured: make(chan struct{}),
	}
	s.agents = make([]*agent, cfg.Agents)
	for i := range s.agents {
		s.agents[i] = s.newAgent(i)
	}
	sem := make(chan struct{}, cfg.DialConcurrency)
	var mu sync.Mutex
	var firstErr error
	var dials sync.WaitGroup
	for _, a := range s.agents {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			dials.Wait()
			s.Close()
			return nil, ctx.Err()
		}
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			<-sem
			break
		}
		dials.Go(func() {
			defer func() { <-sem }()
			conn, err := a.connect(ctx)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			s.wg.Go(func() { a.run(conn) })
		})
	}
	dials.Wait()
	if firstErr != nil {
		s.Close()
		return nil, firstErr
	}
	return s, nil
}

func (s *Swarm) newAgent(i int) *agent {
	m := agentMessages(s.cfg.Prefix, i, s.cfg.Models)
	return &agent{s: s, node: m.Hello.Node, key: m.Snapshot.Engines[0].CapacityKey, msgs: m, snap: m.Snapshot}
}

// AgentMessages are what one simulated agent says: its hello, its
// snapshot, and (through Result) its measurement.
type AgentMessages struct {
	Hello    wire.Hello
	Snapshot wire.Snapshot
	model    string
	tps      float64
}

// Messages returns the messages of a swarm of n agents over models models,
// exactly as Start's agents send them (with prefix "swarm"), so an
// in-process fleet can be built in the same shape.
func Messages(n, models int) []AgentMessages {
	out := make([]AgentMessages, n)
	for i := range out {
		out[i] = agentMessages("swarm", i, max(models, 1))
	}
	return out
}

func agentMessages(prefix string, i, models int) AgentMessages {
	node := fmt.Sprintf("%s-%05d", prefix, i)
	model := fmt.Sprintf("bench-model-%02d", i%models)
	dp := 1
	if i%4 == 3 {
		dp = 2 // every fourth engine has two even data-parallel ranks
	}
	host := wire.Host{
		Hostname: node, OS: "linux", Platform: "ubuntu", PlatformVersion: "24.04",
		KernelVersion: "6.8.0-48-generic", Arch: "amd64", CPUModel: "AMD EPYC 9654 96-Core Processor",
		CPUCores: 96, MemoryTotal: 1 << 40, MemoryAvailable: 800 << 30,
	}
	eng := wire.Engine{
		Kind: wire.EngineVLLM, URL: fmt.Sprintf("http://10.%d.%d.%d:8000", i>>16&255, i>>8&255, i&255),
		Model: model, Models: []string{model}, Version: "0.12.0", Ready: true, CapacityKey: node + ":vllm:" + model,
		LaunchArgs:       []string{"--data-parallel-size=" + fmt.Sprint(dp), "--model=" + model},
		LaunchArgsSource: "cmdline", PID: 4242,
		Load:        wire.Load{Known: true},
		RanksSource: "/var/log/vllm/server.log",
	}
	var gpus []wire.GPU
	for r := range dp {
		uuid := fmt.Sprintf("GPU-%08x-%04x-0000-0000-%012x", i, r, i*16+r)
		gpus = append(gpus, wire.GPU{
			Index: r, UUID: uuid, Name: "NVIDIA H100 80GB HBM3",
			MemoryTotal: 85520809984, MemoryFree: 4 << 30, MemoryUsed: 81 << 30,
			SMClockMHz: 1980, SMClockMaxMHz: 1980, MemClockMHz: 2619, MemClockMaxMHz: 2619,
			TemperatureC: 41, PowerDrawW: 310, PowerLimitW: 700, UtilizationPercent: 37,
			Processes: []wire.GPUProcess{{PID: 4242 + r, Name: "python3", UsedMemory: 76 << 30}},
		})
		eng.GPUUUIDs = append(eng.GPUUUIDs, uuid)
		eng.Ranks = append(eng.Ranks, wire.Rank{DPRank: r, KVTokens: 240000})
		eng.Load.Ranks = append(eng.Load.Ranks, wire.RankLoad{DPRank: r})
	}
	return AgentMessages{
		Hello:    wire.Hello{Node: node, AgentVersion: "swarm", Host: host},
		Snapshot: wire.Snapshot{Node: node, At: time.Now().UTC(), Host: host, GPUs: gpus, Engines: []wire.Engine{eng}},
		model:    model,
		// Plausible speeds over 400..2500 tok/s, deterministic per agent.
		tps: 400 + float64((i*7919)%2101),
	}
}

// Result is the agent's answer to req: a plausible measurement of the
// standard burst.
func (m AgentMessages) Result(req *wire.ProbeRequest) wire.ProbeResult {
	now := time.Now().UTC()
	const conc, tokens = 16, 128
	total := conc * tokens
	wall := float64(total) / m.tps
	meas := wire.Measurement{
		CapacityKey: req.CapacityKey, Node: m.Hello.Node, EngineKind: wire.EngineVLLM,
		EngineURL: m.Snapshot.Engines[0].URL, Model: m.model,
		ThroughputTPS: m.tps, WarmupTPS: m.tps * 0.93, OutputTokens: total, ExpectedTokens: total,
		WallSeconds: wall, Requests: conc, Concurrency: conc, TokensPerReq: tokens,
		DecodeTPSP50: m.tps / conc, DecodeTPSP95: m.tps / conc * 1.05, TTFTP50: 0.04, TTFTP95: 0.06,
		Complete: true, Trigger: req.Reason,
		StartedAt: now.Add(-time.Duration(2 * wall * float64(time.Second))), FinishedAt: now,
	}
	return wire.ProbeResult{RequestID: req.RequestID, Measurement: meas}
}

// connect dials, says hello and sends the first snapshot. The new
// connection becomes the agent's.
func (a *agent) connect(ctx context.Context) (*websocket.Conn, error) {
	s := a.s
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	c, _, err := websocket.Dial(dctx, s.cfg.URL, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + s.cfg.Token}},
	})
	if err != nil {
		return nil, fmt.Errorf("swarm: agent %s: dial: %w", a.node, err)
	}
	c.SetReadLimit(wire.MaxMessageBytes)
	a.mu.Lock()
	a.conn = c
	a.mu.Unlock()
	hello, err := wire.Encode(&a.msgs.Hello)
	if err == nil {
		err = a.write(dctx, hello)
	}
	if err == nil {
		err = a.sendSnapshot(dctx)
	}
	if err != nil {
		a.drop(c)
		return nil, fmt.Errorf("swarm: agent %s: hello: %w", a.node, err)
	}
	s.open.Add(1)
	return c, nil
}

// drop closes c and forgets it if it is still the agent's connection.
func (a *agent) drop(c *websocket.Conn) {
	a.mu.Lock()
	if a.conn == c {
		a.conn = nil
	}
	a.mu.Unlock()
	c.CloseNow()
}

// run serves the agent's connections until the swarm closes: it reads
// (control frames need a reader, and probe requests arrive here), sends
// heartbeats, and reconnects after a drop.
func (a *agent) run(c *websocket.Conn) {
	s := a.s
	backoff := time.Second
	for {
		a.serve(c)
		s.open.Add(-1)
		a.drop(c)
		if s.ctx.Err() != nil {
			return
		}
		s.dropped.Add(1)
		for {
			wait := backoff/2 + time.Duration(rand.Int64N(int64(backoff)))
			backoff = min(2*backoff, 30*time.Second)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(wait):
			}
			var err error
			if c, err = a.connect(s.ctx); err == nil {
				s.reconnects.Add(1)
				backoff = time.Second
				break
			}
			if s.ctx.Err() != nil {
				return
			}
		}
	}
}

// serve reads c until it ends, with a heartbeat beside it.
func (a *agent) serve(c *websocket.Conn) {
	s := a.s
	ctx, cancel := context.WithCancel(s.ctx)
	var hb sync.WaitGroup
	hb.Go(func() { a.heartbeat(ctx) })
	defer func() {
		cancel()
		hb.Wait()
	}()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		env, err := wire.Decode(data)
		if err != nil {
			continue
		}
		switch env.Type {
		case wire.TypeProbeRequest:
			s.probeReqs.Add(1)
			if err := a.answer(env.ProbeRequest); err != nil {
				return
			}
		case wire.TypeCached:
			s.cached.Add(1)
			a.countMeasured()
		}
	}
}

// write sends one message on the agent's current connection.
func (a *agent) write(ctx context.Context, msg []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.writeLocked(ctx, msg)
}

var errNoConn = errors.New("agent not connected")

func (a *agent) writeLocked(ctx context.Context, msg []byte) error {
	if a.conn == nil {
		return errNoConn
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return a.conn.Write(wctx, websocket.MessageText, msg)
}

// sendSnapshot stamps the snapshot with the agent's sequence number and
// sends it; the lock keeps snapshots in stamp order.
func (a *agent) sendSnapshot(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.snap.At = time.Now().UTC()
	seq := int(a.seq.Load())
	e := &a.snap.Engines[0]
	e.Load.Running = seq
	for i := range e.Load.Ranks {
		e.Load.Ranks[i].Running = 0
	}
	e.Load.Ranks[0].Running = seq
	msg, err := wire.Encode(&a.snap)
	if err != nil {
		return err
	}
	if err := a.writeLocked(ctx, msg); err != nil {
		return err
	}
	a.s.snapshots.Add(1)
	return nil
}

func (a *agent) countMeasured() {
	a.once.Do(func() {
		if a.s.measured.Add(1) == int64(len(a.s.agents)) {
			a.s.measuredOnce.Do(func() { close(a.s.allMeasured) })
		}
	})
}

// answer sends the agent's measurement for req.
func (a *agent) answer(req *wire.ProbeRequest) error {
	res := a.msgs.Result(req)
	msg, err := wire.Encode(&res)
	if err != nil {
		return err
	}
	if err := a.write(a.s.ctx, msg); err != nil {
		return err
	}
	a.countMeasured()
	return nil
}

func (a *agent) heartbeat(ctx context.Context) {
	every := a.s.cfg.SnapshotEvery
	t := time.NewTimer(time.Duration(rand.Int64N(int64(every))))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.sendSnapshot(ctx); err != nil {
			return
		}
		t.Reset(every)
	}
}

// WaitMeasured returns once every agent has sent a measurement (or got a
// cached one), or when ctx ends.
func (s *Swarm) WaitMeasured(ctx context.Context) error {
	select {
	case <-s.allMeasured:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("swarm: %d of %d agents measured: %w", s.measured.Load(), len(s.agents), ctx.Err())
	}
}

// Stats returns the swarm's counters.
func (s *Swarm) Stats() Stats {
	return Stats{Open: s.open.Load(), Dropped: s.dropped.Load(), Reconnects: s.reconnects.Load(),
		Snapshots: s.snapshots.Load(), ProbeRequests: s.probeReqs.Load(), Measured: s.measured.Load(),
		Cached: s.cached.Load()}
}

// Visibility measures, samples times, how long a snapshot takes to show in
// GET /api/v1/workers/{id}: it bumps a random agent's sequence number
// (reported as its engine's running requests), sends the snapshot, and
// polls the worker every poll until the API shows the new number. Samples
// are gap apart. A sample not visible within timeout counts as a timeout.
func (s *Swarm) Visibility(ctx context.Context, samples int, gap, poll, timeout time.Duration) ([]time.Duration, int, error) {
	var out []time.Duration
	timeouts := 0
	for i := range samples {
		if i > 0 {
			select {
			case <-ctx.Done():
				return out, timeouts, ctx.Err()
			case <-time.After(gap):
			}
		}
		// An agent between connections cannot be sampled: pick another.
		var d time.Duration
		err := errNoConn
		for try := 0; try < 100 && errors.Is(err, errNoConn); try++ {
			d, err = s.sample(ctx, s.agents[rand.IntN(len(s.agents))], poll, timeout)
		}
		switch {
		case errors.Is(err, errNotVisible):
			timeouts++
		case err != nil:
			return out, timeouts, err
		default:
			out = append(out, d)
		}
	}
	return out, timeouts, nil
}

var errNotVisible = errors.New("snapshot not visible in time")

func (s *Swarm) sample(ctx context.Context, a *agent, poll, timeout time.Duration) (time.Duration, error) {
	want := int(a.seq.Add(1))
	start := time.Now()
	if err := a.sendSnapshot(ctx); err != nil {
		return 0, fmt.Errorf("swarm: send stamped snapshot: %w", err)
	}
	u := s.cfg.API + "/api/v1/workers/" + url.PathEscape(a.key)
	deadline := start.Add(timeout)
	for {
		running, err := s.running(ctx, u)
		if err != nil {
			return 0, err
		}
		if running == want {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, errNotVisible
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// running reads one worker's load.running from the API.
func (s *Swarm) running(ctx context.Context, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("swarm: poll worker: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return -1, nil
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("swarm: poll worker: %s", resp.Status)
	}
	var w struct {
		Load struct {
			Running int `json:"running"`
		} `json:"load"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&w); err != nil {
		return 0, fmt.Errorf("swarm: poll worker: %w", err)
	}
	return w.Load.Running, nil
}

// Close ends every connection and waits for the agents' goroutines.
func (s *Swarm) Close() {
	s.cancel()
	for _, a := range s.agents {
		a.mu.Lock()
		c := a.conn
		a.mu.Unlock()
		if c != nil {
			c.CloseNow()
		}
	}
	s.wg.Wait()
}
