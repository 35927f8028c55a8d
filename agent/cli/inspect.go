package cli

import "fmt"

// runInspect is a placeholder; its owner replaces this file.
func runInspect(args []string, stdio IO) int {
	fmt.Fprintln(stdio.Err, "heft-agent inspect: not built yet")
	return 1
}
