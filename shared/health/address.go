package health

import "heft/shared/wire"

// AddressNotAllowed is the finding of a worker held because the address
// its agent offers gateways is not its node's: reason says which address
// and why (it does not resolve to the node's connection address, names
// the coordinator itself, or a loopback address of another host).
func AddressNotAllowed(node, reason string) Finding {
	return Finding{Code: wire.CodeAddressNotAllowed, Severity: wire.SeverityCritical, Message: "held: the agent on node " + node +
		" offers gateways an address that is not its own: " + reason + ". Set advertise_url on the agent to an address of this node, " +
		"or allow the address for this node in the coordinator's advertise_allow."}
}
