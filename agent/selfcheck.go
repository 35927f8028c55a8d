package agent

import (
	"strings"

	"heft/shared/wire"
)

// dropInvalidReadings takes out of s the readings the agent computes
// itself (an engine's pace, the pace's newest half, its passive capacity)
// that fail the wire's own checks, and says what it dropped. A snapshot
// that fails those checks is never sent (wire.Encode refuses it), so one
// bad figure would otherwise cost the node its every snapshot, and the
// coordinator its word that the node is alive, until the figure changed.
// Dropped, it costs one reading.
func dropInvalidReadings(s *wire.Snapshot) (dropped []string) {
	for i := range s.Engines {
		e := &s.Engines[i]
		for range 3 { // at most one cut per reading
			err := e.Validate()
			if err == nil {
				break
			}
			msg := err.Error()
			switch {
			case e.Pace != nil && e.Pace.Recent != nil && strings.Contains(msg, "engine.pace.recent."):
				e.Pace.Recent = nil
			case e.Pace != nil && strings.Contains(msg, "engine.pace."):
				e.Pace = nil
			case e.Passive != nil && strings.Contains(msg, "engine.passive."):
				e.Passive = nil
			default:
				// Not a reading of the agent's own: the snapshot goes
				// as it is, and the link logs why it cannot be sent.
				msg = ""
			}
			if msg == "" {
				break
			}
			dropped = append(dropped, e.URL+": "+msg)
		}
	}
	return dropped
}
