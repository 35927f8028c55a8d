package cli

import "fmt"

// runRun is a placeholder; its owner replaces this file.
func runRun(args []string, stdio IO) int {
	fmt.Fprintln(stdio.Err, "heft-agent run: not built yet")
	return 1
}
