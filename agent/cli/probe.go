package cli

import "fmt"

// runProbe is a placeholder; its owner replaces this file.
func runProbe(args []string, stdio IO) int {
	fmt.Fprintln(stdio.Err, "heft-agent probe: not built yet")
	return 1
}
