package haproxy

import "heft/gateway/target"

// UseLookup makes h look names up with lookup (a test's fake DNS), with
// the DNS answers its state file keeps.
func (h *HAProxy) UseLookup(lookup target.LookupFunc) {
	h.resolver = target.NewResolver(lookup)
	h.keepAnswers()
}
