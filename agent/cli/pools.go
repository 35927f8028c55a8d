package cli

import "fmt"

// runPools is a placeholder; its owner replaces this file.
func runPools(args []string, stdio IO) int {
	fmt.Fprintln(stdio.Err, "heft-agent pools: not built yet")
	return 1
}
