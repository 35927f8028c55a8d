//go:build race

package probe

// Under the race detector HTTP and JSON of long prompts cost several
// times more; prefill tests read at a rate that keeps that small.
const raceEnabled = true
