package fleet

import (
	"fmt"

	"heft/shared/wire"
)

// Pin replaces a worker's computed weight with weight, which must be a
// finite number above zero, until Unpin. The pin is stored first: when
// the store fails, the fleet is unchanged.
func (f *Fleet) Pin(id string, weight float64) error {
	if !validWeight(weight) {
		return fmt.Errorf("%w: pinned weight %v must be a finite number above zero", ErrInvalid, weight)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.keyed(id)
	if err != nil {
		return err
	}
	if err := f.st.SavePin(id, weight); err != nil {
		return fmt.Errorf("fleet: pin %q: %w", id, err)
	}
	f.pins[id] = weight
	f.dirty[w.eng.Model] = true
	f.log.Info("weight pinned", "worker", id, "weight", weight)
	f.changed(w)
	return nil
}

// Unpin clears a pin. Clearing a worker that has none is not an error; a
// pin may be cleared even after its worker was forgotten.
func (f *Fleet) Unpin(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, pinned := f.pins[id]
	w := f.workers[id]
	if w == nil && !pinned {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if !pinned {
		return nil
	}
	if err := f.st.DeletePin(id); err != nil {
		return fmt.Errorf("fleet: unpin %q: %w", id, err)
	}
	delete(f.pins, id)
	if w != nil {
		f.dirty[w.eng.Model] = true
	}
	f.log.Info("pin cleared", "worker", id)
	f.changed(w)
	return nil
}

// Admit lets a worker that its uneven pools would hold into the weight
// table. For a worker the rules would admit anyway it clears any decision,
// returning it to the automatic rules (this is how a Hold is undone).
func (f *Fleet) Admit(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.keyed(id)
	if err != nil {
		return err
	}
	if f.poolHolds(w) {
		return f.decide(w, DecisionAdmit)
	}
	if _, ok := f.decisions[id]; !ok {
		return nil
	}
	if err := f.st.DeleteDecision(id); err != nil {
		return fmt.Errorf("fleet: admit %q: %w", id, err)
	}
	delete(f.decisions, id)
	f.log.Info("admin decision cleared", "worker", id)
	f.changed(w)
	return nil
}

// Hold keeps a worker out of the weight table whatever its facts, until
// Admit.
func (f *Fleet) Hold(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.keyed(id)
	if err != nil {
		return err
	}
	return f.decide(w, DecisionHold)
}

func (f *Fleet) decide(w *worker, d string) error {
	if f.decisions[w.id] == d {
		return nil
	}
	if err := f.st.SaveDecision(w.id, d); err != nil {
		return fmt.Errorf("fleet: %s %q: %w", d, w.id, err)
	}
	f.decisions[w.id] = d
	f.log.Info("admin decision", "worker", w.id, "decision", d)
	f.changed(w)
	return nil
}

// Probe asks the worker's agent to measure it now, even on a busy engine.
// While an on-demand request is already outstanding it sends nothing more.
func (f *Fleet) Probe(id string) ([]Action, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.keyed(id)
	if err != nil {
		return nil, err
	}
	if !f.connected(w) {
		return nil, fmt.Errorf("%w: node %s", ErrNotConnected, w.node)
	}
	now := f.now()
	p := w.probe
	if p.outstanding && p.reason == wire.ReasonOnDemand && now.Before(p.sentAt.Add(f.cfg.ProbeTimeout)) {
		return nil, nil
	}
	act := f.sendProbe(w, wire.ReasonOnDemand, now)
	f.changed(w)
	return []Action{act}, nil
}

// keyed finds a worker that has a capacity key.
func (f *Fleet) keyed(id string) (*worker, error) {
	w := f.workers[id]
	if w == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if w.placeholder {
		return nil, fmt.Errorf("%w: worker %q has no capacity key yet (its engine could not be read)", ErrInvalid, id)
	}
	return w, nil
}

// changed re-derives a worker's model after an admin action and notifies.
func (f *Fleet) changed(w *worker) {
	if w != nil {
		f.refresh(f.now(), w)
	}
	f.notify()
}
