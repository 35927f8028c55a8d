package cli

import "context"

// RunAgent runs `heft-agent run` with args under ctx instead of the
// process's signals, so tests and benchmarks can start and stop a real
// agent in process. It returns the exit code.
func RunAgent(ctx context.Context, args []string, env func(string) string, stdio IO) int {
	return runAgent(ctx, args, env, stdio)
}
