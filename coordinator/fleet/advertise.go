package fleet

import (
	"maps"

	"heft/shared/health"
)

// SetAddressRefusals records, for the node's engines by capacity key, why
// the address each offers gateways is not the node's to offer (the server
// checks it against the connection's source and advertise_allow, which the
// fleet does not see). A worker with a refusal is held with
// address_not_allowed, whatever an admin decided, until its node offers an
// address it may. It replaces the node's earlier refusals; the server calls
// it before handing the fleet each snapshot.
func (f *Fleet) SetAddressRefusals(nodeName string, refused map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodeFor(nodeName)
	if maps.Equal(n.badAddr, refused) {
		return
	}
	n.badAddr = maps.Clone(refused)
	if f.refreshNode(n, f.now()) {
		f.notify()
	}
}

// addressRefused is why the worker's address was refused, or "".
func (f *Fleet) addressRefused(w *worker) string {
	if n := f.nodes[w.node]; n != nil {
		return n.badAddr[w.id]
	}
	return ""
}

func addressFinding(w *worker, reason string) health.Finding {
	return health.AddressNotAllowed(w.node, reason)
}
