package sim

import (
	"fmt"
	"slices"
)

// Log namings: how the start-up log names the data-parallel ranks, one for
// each way the engines have done it (see agent/enginelog and
// testdata/engines/wild for the real logs).
const (
	// NamingNewest: vLLM "(EngineCore_DP<n> pid=N)" (v0.10.2 on), SGLang
	// "[date DP<n>]".
	NamingNewest = ""
	// NamingEngineCoreN: vLLM "(EngineCore_<n> pid=N)", v0.8.3 to v0.10.1.
	NamingEngineCoreN = "enginecore-n"
	// NamingDPAttention: SGLang with --enable-dp-attention, where only DP0
	// prints its pool (max_total_num_tokens) and the other ranks none.
	NamingDPAttention = "dp-attention"
	// NamingRouter: SGLang's router (sglang_router.launch_server --dp N)
	// starting DP separate servers: a launch command, one server_args per
	// server (each its own port), and lines tagged "TP0" only.
	NamingRouter = "router"
)

var namings = []string{NamingNewest, NamingEngineCoreN, NamingDPAttention, NamingRouter}

// MultiNode makes a vLLM sim one node of a multi-node data-parallel
// deployment (vllm serve --data-parallel-size Size --data-parallel-size-local
// DP --data-parallel-start-rank StartRank --data-parallel-address Address
// --data-parallel-rpc-port RPCPort [--headless]): its log and launch
// arguments name its ranks StartRank.. of Size. Size 0: one node.
type MultiNode struct {
	Size      int
	StartRank int
	Address   string
	RPCPort   int
	Headless  bool
}

// validateNaming checks LogNaming and MultiNode against the flavour.
func (c *Config) validateNaming(bad func(string, ...any)) {
	switch {
	case !slices.Contains(namings, c.LogNaming):
		bad("log naming %q is not one of %q", c.LogNaming, namings)
	case c.LogNaming == NamingEngineCoreN && c.Flavor != FlavorVLLM,
		(c.LogNaming == NamingDPAttention || c.LogNaming == NamingRouter) && c.Flavor != FlavorSGLang:
		bad("log naming %q is not %s's", c.LogNaming, c.Flavor)
	}
	m := c.MultiNode
	switch {
	case m.Size == 0:
	case c.Flavor != FlavorVLLM:
		bad("multi-node args are vLLM's; flavor is %s", c.Flavor)
	case m.Size < c.DP || m.StartRank < 0 || m.StartRank+c.DP > m.Size || m.Size > maxDP:
		bad("multi-node: ranks %d..%d do not fit a deployment of %d", m.StartRank, m.StartRank+c.DP-1, m.Size)
	case m.Address == "" || m.RPCPort <= 0:
		bad("multi-node: the data-parallel address and RPC port are required")
	}
}

// globalRank is local rank i's rank in the whole deployment.
func (s *Server) globalRank(i int) int { return s.cfg.MultiNode.StartRank + i }

// vllmCore is the process prefix of local rank i's engine core.
func (s *Server) vllmCore(i int) string {
	pid := s.pid + 1 + i
	switch {
	case s.cfg.DP == 1 && s.cfg.MultiNode.Size == 0:
		return fmt.Sprintf("(EngineCore pid=%d) ", pid)
	case s.cfg.LogNaming == NamingEngineCoreN:
		return fmt.Sprintf("(EngineCore_%d pid=%d) ", s.globalRank(i), pid)
	}
	return fmt.Sprintf("(EngineCore_DP%d pid=%d) ", s.globalRank(i), pid)
}

// multiNodeArgs are the vLLM launch arguments of a multi-node node.
func (s *Server) multiNodeArgs() []pyArg {
	m := s.cfg.MultiNode
	if m.Size == 0 {
		return nil
	}
	args := []pyArg{{"data_parallel_size", m.Size}, {"data_parallel_size_local", s.cfg.DP},
		{"data_parallel_address", m.Address}, {"data_parallel_rpc_port", m.RPCPort}}
	if m.StartRank > 0 {
		args = append(args, pyArg{"data_parallel_start_rank", m.StartRank})
	}
	if m.Headless {
		args = append(args, pyArg{"headless", true})
	}
	return args
}

// sglangTag is the rank part of an SGLang line's header for local rank
// rank (-1: the main process).
func (s *Server) sglangTag(rank int) string {
	switch {
	case rank < 0:
		return ""
	case s.cfg.LogNaming == NamingRouter:
		return " TP0" // each router worker is a server of its own, DP 1
	case s.cfg.DP > 1:
		return fmt.Sprintf(" DP%d", rank)
	}
	return ""
}

// sglangPrintsPool says whether local rank i's pool lines appear.
func (s *Server) sglangPrintsPool(i int) bool {
	return s.cfg.LogNaming != NamingDPAttention || i == 0
}
