package nodes

import (
	"fmt"
	"time"
)

// New names are rate-limited per agent token and per source address:
// every name costs a stored record, and one agent token inventing names
// in a loop would otherwise grow the state by megabytes a second. The
// counts are per minute (fixed windows); a known name reconnecting is
// never counted, so a reconnect storm after a coordinator restart passes
// whole. A refused new name retries, as its agent does after any close.

// rates counts the new names of the current minute.
type rates struct {
	window    time.Time
	byToken   map[string]int
	byAddress map[string]int
}

// maxAddresses bounds the addresses counted in one minute: past it, new
// names from addresses not yet counted share one count.
const maxAddresses = 4096

// rateLimited counts a new name for h, or refuses it when its token or
// address has had its names this minute. The caller holds mu.
func (r *Registry) rateLimited(h Hello, now time.Time) (Decision, bool) {
	rt := &r.rates
	if w := now.Truncate(time.Minute); !w.Equal(rt.window) || rt.byToken == nil {
		rt.window, rt.byToken, rt.byAddress = w, map[string]int{}, map[string]int{}
	}
	addr := h.Address
	if _, ok := rt.byAddress[addr]; !ok && len(rt.byAddress) >= maxAddresses {
		addr = "(other addresses)"
	}
	var what string
	switch {
	case r.cfg.NewPerToken > 0 && rt.byToken[h.Token] >= r.cfg.NewPerToken:
		what = fmt.Sprintf("%d new node names this minute with this agent token (new_nodes_per_minute_per_token)", r.cfg.NewPerToken)
	case r.cfg.NewPerAddress > 0 && rt.byAddress[addr] >= r.cfg.NewPerAddress:
		what = fmt.Sprintf("%d new node names this minute from %s (new_nodes_per_minute_per_address)", r.cfg.NewPerAddress, h.Address)
	}
	if what != "" {
		return Decision{Outcome: Limit, Label: LabelRate, Close: "too many new node names this minute; retry later",
			Reason: "refusing a new node name: " + what}, true
	}
	rt.byToken[h.Token]++
	rt.byAddress[addr]++
	return Decision{}, false
}
