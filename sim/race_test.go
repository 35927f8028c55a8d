//go:build race

package sim

// Under the race detector HTTP and JSON cost several times more, and a
// burst of long prompts spends tens of milliseconds in them.
const raceEnabled = true
