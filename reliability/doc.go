// Package reliability holds heft's fault tests: the coordinator killed
// with SIGKILL in the middle of writes, a thousand agents reconnecting at
// once after a coordinator restart, the network to one agent cut or
// silently stalled, engines restarted with the same and with other launch
// arguments, an engine log replaced while it is followed, and stuck
// websocket peers. Each test runs real parts on loopback: the real
// heft-coordinator binary or its packages over a bbolt state directory,
// real agent links, real simulated engines.
//
// The package has no code of its own; it exists for its tests.
package reliability
