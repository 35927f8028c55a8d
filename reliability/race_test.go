//go:build race

package reliability

// raceEnabled scales the reconnect storm down under the race detector.
const raceEnabled = true
