// Package cli implements heft-agent's subcommands. Each subcommand lives in
// its own file as func(args []string, io IO) int.
package cli

import (
	"flag"
	"fmt"
	"io"

	"heft/shared/settings"
	"heft/shared/version"
)

// IO is where a subcommand reads and writes.
type IO struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

type command struct {
	name    string
	summary string
	run     func(args []string, stdio IO) int
}

func commands() []command {
	return []command{
		{"run", "run the agent service: collect, measure, report to the coordinator", runRun},
		{"inspect", "show what the agent sees on this host (GPUs, engines, pools, load, warnings)", runInspect},
		{"pools", "read an engine's start-up log and print each data-parallel rank's KV pool", runPools},
		{"probe", "warm an engine and measure its throughput with the standard burst", runProbe},
		{"version", "print the agent's version", runVersion},
	}
}

// Main dispatches to a subcommand and returns the process exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	stdio := IO{In: in, Out: out, Err: errOut}
	if len(args) == 0 {
		fmt.Fprintf(errOut, "heft-agent: no command given\n\n")
		usage(errOut)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(out)
		return 0
	case "-version", "--version":
		return runVersion(nil, stdio)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdio)
		}
	}
	fmt.Fprintf(errOut, "heft-agent: unknown command %q\n\n", args[0])
	usage(errOut)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: heft-agent <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "flags:")
	fmt.Fprintln(w, "  --version   print the version and exit")
	fmt.Fprintln(w, "  -h, --help  print this help and exit")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "run 'heft-agent <command> --help' for a command's flags")
}

// runVersion is `heft-agent version`: no flags and no arguments, so
// --help prints its usage and anything else is a usage error (2), as for
// every subcommand.
func runVersion(args []string, stdio IO) int {
	fs := flag.NewFlagSet("heft-agent version", flag.ContinueOnError)
	usage := func(w io.Writer) {
		fmt.Fprintln(w, "usage: heft-agent version")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Prints the agent's version (as heft-agent --version does) and exits 0.")
	}
	if code, ok := settings.ParseFlags(fs, args, usage, stdio.Out, stdio.Err); !ok {
		return code
	}
	fmt.Fprintf(stdio.Out, "heft-agent %s\n", version.Version)
	return 0
}
