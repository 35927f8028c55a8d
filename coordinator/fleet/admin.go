package fleet

import (
	"fmt"

	"heft/shared/view"
	"heft/shared/wire"
)

// Admin actions write to the store before they change memory, so what the
// API shows survives a crash, and when the write fails the fleet is as it
// was. The write syncs to disk, so it is made outside f.mu (agents' reports
// and API reads go on meanwhile); adminMu keeps admin actions in order
// among themselves, so a decision made on what f.mu showed still holds when
// it is applied. Only admin actions change pins and decisions.

// Pin replaces a worker's computed weight with weight, which must be a
// finite number above zero, until Unpin.
func (f *Fleet) Pin(id string, weight float64) error { return f.PinKind(id, view.WeightDecode, weight) }

// Unpin clears a pin. Clearing a worker that has none is not an error; a
// pin may be cleared even after its worker was forgotten.
func (f *Fleet) Unpin(id string) error { return f.UnpinKind(id, view.WeightDecode) }

// PinKind pins one kind of a worker's weight (view.WeightDecode, as Pin, or
// view.WeightPrefill); the two kinds are pinned and cleared apart.
func (f *Fleet) PinKind(id, kind string, weight float64) error {
	save, _, err := f.pinStore(kind)
	if err != nil {
		return err
	}
	if !validWeight(weight) {
		return fmt.Errorf("%w: pinned weight %v must be a finite number above zero", ErrInvalid, weight)
	}
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	f.mu.Lock()
	_, err = f.keyed(id)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if err := save(id, weight); err != nil {
		return fmt.Errorf("fleet: pin %s weight of %q: %w", kind, id, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pinsOf(kind)[id] = weight
	f.log.Info("weight pinned", "worker", id, "kind", kind, "weight", weight)
	f.changedAdmin(id)
	return nil
}

// UnpinKind clears one kind of pin, as Unpin does.
func (f *Fleet) UnpinKind(id, kind string) error {
	_, del, err := f.pinStore(kind)
	if err != nil {
		return err
	}
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	f.mu.Lock()
	_, pinned := f.pinsOf(kind)[id]
	known := f.workers[id] != nil
	f.mu.Unlock()
	if !known && !pinned {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if !pinned {
		return nil
	}
	if err := del(id); err != nil {
		return fmt.Errorf("fleet: unpin %s weight of %q: %w", kind, id, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pinsOf(kind), id)
	f.log.Info("pin cleared", "worker", id, "kind", kind)
	f.changedAdmin(id)
	return nil
}

// pinStore returns the store's writes for one kind of pin.
func (f *Fleet) pinStore(kind string) (save func(string, float64) error, del func(string) error, err error) {
	switch kind {
	case view.WeightDecode:
		return f.st.SavePin, f.st.DeletePin, nil
	case view.WeightPrefill:
		return f.st.SavePrefillPin, f.st.DeletePrefillPin, nil
	}
	return nil, nil, fmt.Errorf("%w: weight kind %q is not %q or %q", ErrInvalid, kind, view.WeightDecode, view.WeightPrefill)
}

// pinsOf returns one kind's pins; the caller holds mu (or adminMu, to
// read), and kind is valid.
func (f *Fleet) pinsOf(kind string) map[string]float64 {
	if kind == view.WeightPrefill {
		return f.prefillPins
	}
	return f.pins
}

// Admit lets a worker that its uneven pools, or an implausible
// measurement, would hold into the weight table, and ends a worker's
// probation (probation.go). For a worker the rules would admit anyway it clears any decision,
// returning it to the automatic rules (this is how a Hold is undone).
func (f *Fleet) Admit(id string) error {
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	f.mu.Lock()
	w, err := f.keyed(id)
	var holds, decided bool
	if err == nil {
		holds = f.poolHolds(w) || f.implausibleHolds(w) || f.onProbation(w, f.now())
		_, decided = f.decisions[id]
	}
	f.mu.Unlock()
	switch {
	case err != nil:
		return err
	case holds:
		return f.decide(id, DecisionAdmit)
	case !decided:
		return nil
	}
	if err := f.st.DeleteDecision(id); err != nil {
		return fmt.Errorf("fleet: admit %q: %w", id, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.decisions, id)
	f.log.Info("admin decision cleared", "worker", id)
	f.changedAdmin(id)
	return nil
}

// Hold keeps a worker out of the weight table whatever its facts, until
// Admit. heft-sync's floor may still keep it in the gateways when it is
// one of the last of its model; HoldBelowFloor lets it go even then.
func (f *Fleet) Hold(id string) error { return f.hold(id, DecisionHold) }

// HoldBelowFloor holds a worker as Hold does, and marks the hold as one
// the admin let take the model below heft-sync's floor (to none, if it is
// the last). A later Hold replaces the mark; Admit clears both.
func (f *Fleet) HoldBelowFloor(id string) error { return f.hold(id, DecisionHoldBelowFloor) }

// publicDecision is a decision as the API shows it in admin_decision: a
// hold below the floor is a hold (view.Worker.BelowFloor marks it).
func publicDecision(d string) string {
	if isHold(d) {
		return DecisionHold
	}
	return d
}

func (f *Fleet) hold(id, decision string) error {
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	f.mu.Lock()
	_, err := f.keyed(id)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.decide(id, decision)
}

// decide stores and applies a decision; the caller holds adminMu, not mu.
func (f *Fleet) decide(id, d string) error {
	f.mu.Lock()
	same := f.decisions[id] == d
	f.mu.Unlock()
	if same {
		return nil
	}
	if err := f.st.SaveDecision(id, d); err != nil {
		return fmt.Errorf("fleet: %s %q: %w", d, id, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.decisions[id] = d
	f.log.Info("admin decision", "worker", id, "decision", d)
	f.changedAdmin(id)
	return nil
}

// Probe asks the worker's agent to measure it now, even on a busy engine
// (as its probe_busy says: an admin's request is never idle-only).
// While an on-demand request that is not idle-only is already
// outstanding it sends nothing more.
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
	if p.outstanding && p.reason == wire.ReasonOnDemand && !p.idleOnly && now.Before(p.sentAt.Add(f.cfg.ProbeTimeout)) {
		return nil, nil
	}
	act := f.sendProbe(w, wire.ReasonOnDemand, now, false)
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

// changedAdmin marks the model of the worker a pin or decision was written
// for (it may have been forgotten during the write) for re-weighing, and
// re-derives it.
func (f *Fleet) changedAdmin(id string) {
	w := f.workers[id]
	if w != nil {
		f.dirty[w.eng.Model] = true
	}
	f.changed(w)
}
