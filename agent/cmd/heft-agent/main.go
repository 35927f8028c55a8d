// Command heft-agent runs beside an inference engine: it reads the host's
// GPUs and the engine's facts, measures the engine, and reports to
// heft-coordinator. See `heft-agent help`.
package main

import (
	"os"

	"heft/agent/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
