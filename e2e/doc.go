// Package e2e holds end-to-end tests: real heft-sim engines, real agents
// and a real coordinator, talking over loopback websockets and HTTP.
package e2e
