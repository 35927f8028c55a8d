package fleet

import (
	"sync"
	"testing"
	"time"

	"heft/shared/view"
)

// An admin action waits for its disk write outside the fleet's lock: while
// the write is held, agents' reports, the periodic tick and API reads go
// on (review §1.5.1), and the API still shows the fleet as it was, because
// the write comes before the change.
func TestAdminWriteDoesNotHoldTheLock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(h *harness)
		act    func(f *Fleet) error
		before func(w view.Worker) bool // what the API shows during the write
		after  func(w view.Worker) bool
	}{
		{"pin", nil, func(f *Fleet) error { return f.Pin("k", 2) },
			func(w view.Worker) bool { return w.PinnedWeight == nil },
			func(w view.Worker) bool { return w.PinnedWeight != nil && *w.PinnedWeight == 2 }},
		{"unpin", func(h *harness) { _ = h.f.Pin("k", 2) }, func(f *Fleet) error { return f.Unpin("k") },
			func(w view.Worker) bool { return w.PinnedWeight != nil },
			func(w view.Worker) bool { return w.PinnedWeight == nil }},
		{"hold", nil, func(f *Fleet) error { return f.Hold("k") },
			func(w view.Worker) bool { return w.State == view.StateAdmitted },
			func(w view.Worker) bool { return w.State == view.StateHeld }},
		{"admit clears a hold", func(h *harness) { _ = h.f.Hold("k") }, func(f *Fleet) error { return f.Admit("k") },
			func(w view.Worker) bool { return w.State == view.StateHeld },
			func(w view.Worker) bool { return w.State == view.StateAdmitted && w.AdminDecision == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.admit("n", engine("k", "http://1:8000", "m"), 500)
			if tc.setup != nil {
				tc.setup(h)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			h.st.mu.Lock()
			h.st.adminGate = func() { close(entered); <-release }
			h.st.mu.Unlock()
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()

			done := make(chan error, 1)
			go func() { done <- tc.act(h.f) }()
			select {
			case <-entered:
			case err := <-done:
				t.Fatalf("the action returned (%v) without writing", err)
			}
			// The write is held. Everything that takes the fleet's lock
			// must still get through; a generous bound turns a deadlock
			// into a failure rather than a hung test.
			others := make(chan view.Worker, 1)
			go func() {
				h.snapshot("n")
				h.f.Tick()
				w, _ := h.f.Worker("k")
				others <- w
			}()
			select {
			case w := <-others:
				if !tc.before(w) {
					t.Errorf("during the write the API shows the change already: %+v", w)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a snapshot, a tick and a read waited for an admin action's disk write")
			}
			released = true
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if w := h.worker("k"); !tc.after(w) {
				t.Errorf("after the write: %+v", w)
			}
		})
	}
}

// Admin actions racing each other leave memory as the store has it: the
// last write is the one shown.
func TestConcurrentAdminActionsAgreeWithTheStore(t *testing.T) {
	h := newHarness(t)
	h.admit("n", engine("k", "http://1:8000", "m"), 500)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			var err error
			switch i % 4 {
			case 0:
				err = h.f.Pin("k", float64(1+i%3))
			case 1:
				err = h.f.Unpin("k")
			case 2:
				err = h.f.Hold("k")
			case 3:
				err = h.f.Admit("k")
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	stored, w := h.st.state(), h.worker("k")
	pin, pinned := stored.Pins["k"]
	if pinned != (w.PinnedWeight != nil) || (pinned && pin != *w.PinnedWeight) {
		t.Errorf("stored pin %v (%t), shown %v", pin, pinned, w.PinnedWeight)
	}
	if stored.Decisions["k"] != w.AdminDecision {
		t.Errorf("stored decision %q, shown %q", stored.Decisions["k"], w.AdminDecision)
	}
}
