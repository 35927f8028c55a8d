package link

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

func TestOutboxBoundedKeepsAnswers(t *testing.T) {
	l := &link{wake: make(chan struct{}, 1), log: hclog.NewNullLogger(), probing: map[string]bool{}}
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	for i := range maxOutbox {
		l.send(&wire.ProbeResult{RequestID: fmt.Sprint(i), Measurement: measurement("k")}, true)
	}
	if len(l.outbox) != maxOutbox {
		t.Fatalf("outbox holds %d, want %d", len(l.outbox), maxOutbox)
	}
	for _, m := range l.outbox {
		if !m.durable {
			t.Fatal("the transient note was kept over a result")
		}
	}
	// Full of answers: the oldest answer goes.
	l.send(&wire.ProbeResult{RequestID: "last", Measurement: measurement("k")}, true)
	first := l.outbox[0].payload.(*wire.ProbeResult).RequestID
	last := l.outbox[len(l.outbox)-1].payload.(*wire.ProbeResult).RequestID
	if len(l.outbox) != maxOutbox || first != "1" || last != "last" {
		t.Errorf("outbox %d long, %s..%s; want %d, 1..last", len(l.outbox), first, last, maxOutbox)
	}
	// A transient note finding the box full of answers is the one dropped.
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	if len(l.outbox) != maxOutbox || !l.outbox[len(l.outbox)-1].durable {
		t.Errorf("a note displaced an answer")
	}

	// A lost connection keeps answers only, and no snapshot.
	l = &link{wake: make(chan struct{}, 1), log: hclog.NewNullLogger()}
	l.send(&wire.ProbeResult{RequestID: "a", Measurement: measurement("k")}, true)
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeRunning}, false)
	l.send(&wire.ProbeStatus{CapacityKey: "k", State: wire.ProbeFailed}, true)
	l.offer(wire.Snapshot{Node: "n"})
	l.dropTransient()
	if len(l.outbox) != 2 || !l.outbox[0].durable || !l.outbox[1].durable || l.slot != nil {
		t.Errorf("after dropTransient: %+v, slot %v", l.outbox, l.slot)
	}
}
