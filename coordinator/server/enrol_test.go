package server

import (
	"slices"
	"sync"
	"testing"
	"time"

	"heft/coordinator/nodes"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// gatedStore holds the next SaveNode, as a busy disk holds an enrolment,
// until its release is called.
type gatedStore struct {
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
	deleted []string
}

func (g *gatedStore) hold() (entered <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.entered = make(chan struct{}), make(chan struct{})
	gate := g.gate
	return g.entered, func() { close(gate) }
}

func (g *gatedStore) SaveNode(nodes.Record) error {
	g.mu.Lock()
	gate, entered := g.gate, g.entered
	g.gate = nil
	g.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
	return nil
}

func (g *gatedStore) DeleteNode(name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deleted = append(g.deleted, name)
	return nil
}

// An enrolment slow to store (a thousand agents enrolling at once on a
// busy machine) loses no node. The coordinator's own pings do not end
// the connection meanwhile: its reader, which takes the pong, waits for
// the hello. And a credential whose connection ended before the agent
// read it is taken back, so the agent's next connection enrols again
// instead of being refused until an admin releases the name.
func TestSlowEnrolmentLosesNoNode(t *testing.T) {
	g := &gatedStore{}
	reg, err := nodes.New(nodes.DefaultConfig(), g, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Nodes = reg
	ts := startServer(t, opts, func(s *Server) { s.lim.pingEvery, s.lim.pingTimeout = 20*time.Millisecond, 20*time.Millisecond })

	entered, release := g.hold()
	c, _, err := dial(t, ts, agentToken)
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, c: c, node: "gpu-a"}
	a.send(&wire.Hello{Node: "gpu-a", AgentVersion: "test", KeepsCredential: true})
	<-entered
	// Ten rounds of ping and timeout: a ping during the hello would have
	// ended the connection by now.
	time.Sleep(400 * time.Millisecond)
	release()
	if env := a.read(); env.Type != wire.TypeWelcome || env.Welcome.NodeCredential == "" {
		t.Fatalf("the slow enrolment's connection got %+v, want its welcome with a credential", env)
	}

	entered, release = g.hold()
	c, _, err = dial(t, ts, agentToken)
	if err != nil {
		t.Fatal(err)
	}
	b := &agent{t: t, c: c, node: "gpu-b"}
	b.send(&wire.Hello{Node: "gpu-b", AgentVersion: "test", KeepsCredential: true})
	<-entered
	_ = c.CloseNow() // the agent gives up before its welcome
	release()
	testutil.Eventually(t, "the undelivered credential taken back", 10*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		_, ok := reg.Get("gpu-b")
		return slices.Contains(g.deleted, "gpu-b") && !ok
	})
	if _, w := hello(t, ts, "gpu-b", "", true); w == nil || w.NodeCredential == "" {
		t.Fatalf("the agent's next connection: welcome %+v, closed %d %q; want a new enrolment", w, lastClose.Code, lastClose.Reason)
	}
}
