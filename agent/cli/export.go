package cli

import "context"

// RunAgent runs `heft-agent run` with args under ctx instead of the
// process's signals, so end-to-end tests can start and stop a real agent
// in process from its flags and config file, as an operator would. It
// returns the exit code. (agent.Run is the assembly without the flags.)
func RunAgent(ctx context.Context, args []string, env func(string) string, stdio IO) int {
	return runAgent(ctx, args, env, stdio)
}
