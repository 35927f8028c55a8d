package fleet

import (
	"errors"
	"fmt"
	"slices"
)

// Held is what the fleet holds of a node name, all of which ForgetNode
// forgets. A name's tombs can outlive its record in the node registry (a
// tomb whose deletion failed comes back at a restart), so an admin's
// release asks the fleet too before it answers that the name is unknown.
type Held struct {
	Workers      int `json:"workers"`
	CapacityKeys int `json:"capacity_keys"`
	KeyTombs     int `json:"key_tombs"`
}

// Any says whether anything is held.
func (h Held) Any() bool { return h != Held{} }

// Held says what the fleet holds of node.
func (f *Fleet) Held(node string) Held {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := Held{CapacityKeys: len(f.keys[node]), KeyTombs: len(f.tombsOf[node])}
	if n := f.nodes[node]; n != nil {
		h.Workers = len(n.workers)
	}
	return h
}

// ForgetNode forgets what the fleet holds of a node name: its workers, the
// capacity keys it owns or owned (their tombs), their pins of both kinds,
// admin decisions and cached measurements, in the store first. An admin
// releasing a name calls it, so that whoever binds the name next inherits
// nothing: no pin, no admit, no measurement to be weighed by without a
// probe, no hold on a key another node lists. A store write that fails
// leaves that record, and the error says which.
func (f *Fleet) ForgetNode(node string) error {
	f.adminMu.Lock()
	defer f.adminMu.Unlock()
	f.mu.Lock()
	var keys []string
	for k := range f.keys[node] {
		keys = append(keys, k)
	}
	if n := f.nodes[node]; n != nil {
		for id := range n.workers {
			if !slices.Contains(keys, id) {
				keys = append(keys, id)
			}
		}
	}
	type admin struct{ pin, prefillPin, decision bool }
	had := make(map[string]admin, len(keys))
	for _, k := range keys {
		_, pin := f.pins[k]
		_, prefillPin := f.prefillPins[k]
		_, decision := f.decisions[k]
		had[k] = admin{pin, prefillPin, decision}
	}
	f.mu.Unlock()

	var errs []error
	gone := make(map[string]admin, len(keys))
	for _, k := range keys {
		h, g := had[k], admin{}
		if h.pin {
			g.pin = f.st.DeletePin(k) == nil
		}
		if h.prefillPin {
			g.prefillPin = f.st.DeletePrefillPin(k) == nil
		}
		if h.decision {
			g.decision = f.st.DeleteDecision(k) == nil
		}
		if g != h {
			errs = append(errs, fmt.Errorf("fleet: forget node %s: could not delete every stored pin or decision of %q", node, k))
		}
		gone[k] = g
	}

	f.mu.Lock()
	for _, k := range keys {
		g := gone[k]
		if g.pin {
			delete(f.pins, k)
		}
		if g.prefillPin {
			delete(f.prefillPins, k)
		}
		if g.decision {
			delete(f.decisions, k)
		}
		if w := f.workers[k]; w != nil && w.node == node {
			f.drop(w)
			f.forgets = append(f.forgets, forget{key: k, worker: true})
		}
		if f.owner[k] == node {
			f.release(k) // its cached measurements too
		}
	}
	if n := f.nodes[node]; n != nil {
		n.badAddr = nil
	}
	f.unburyNode(node)
	f.refresh(f.now())
	f.notify()
	f.mu.Unlock()
	f.writeRecords()
	f.log.Info("node forgotten: its workers, keys, pins, decisions and measurements", "node", node, "capacity_keys", len(keys))
	return errors.Join(errs...)
}
