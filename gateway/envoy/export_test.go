package envoy

import "heft/gateway/target"

// UseLookup makes c look names up with lookup (a test's fake DNS), with
// the DNS answers its state file keeps, and returns c.
func (c *Cluster) UseLookup(lookup target.LookupFunc) *Cluster {
	c.resolver = target.NewResolver(lookup)
	c.keepAnswers()
	return c
}

// DialAddr is dialAddr, for tests.
var DialAddr = dialAddr
