// Command elfcheck prints what a Linux binary needs from the system, for
// scripts/package.sh and for people:
//
//	elfcheck BINARY...               one line per binary: static, or its loader, libraries and glibc floor
//	elfcheck --glibc-floor BINARY    the glibc version its package must require
//	elfcheck --static BINARY...      exit 1 unless every binary is static
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"heft/packaging/elfcheck"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("elfcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	floor := fs.Bool("glibc-floor", false, "print the glibc version the binary's package must require")
	static := fs.Bool("static", false, "fail unless every binary is static")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || (*floor && fs.NArg() != 1) {
		fmt.Fprintln(stderr, "usage: elfcheck [--glibc-floor BINARY | --static BINARY... | BINARY...]")
		return 2
	}
	status := 0
	for _, path := range fs.Args() {
		n, err := elfcheck.Read(path)
		if err != nil {
			fmt.Fprintf(stderr, "elfcheck: %v\n", err)
			return 1
		}
		switch {
		case *floor:
			if n.Static {
				fmt.Fprintf(stderr, "elfcheck: %s is static: it needs no glibc\n", path)
				return 1
			}
			fmt.Fprintln(stdout, n.DeclaredGlibc())
		case *static:
			if !n.Static {
				fmt.Fprintf(stderr, "elfcheck: %s is not static: it loads %s\n", path, strings.Join(append([]string{n.Interp}, n.Libraries...), ", "))
				status = 1
			}
		case n.Static:
			fmt.Fprintf(stdout, "%s: static\n", path)
		default:
			versioned := "no versioned glibc symbol"
			if n.GlibcFloor != "" {
				versioned = "highest glibc symbol version GLIBC_" + n.GlibcFloor
			}
			fmt.Fprintf(stdout, "%s: loader %s, libraries %s, %s, declare glibc >= %s\n",
				path, n.Interp, strings.Join(n.Libraries, " "), versioned, n.DeclaredGlibc())
		}
	}
	return status
}
