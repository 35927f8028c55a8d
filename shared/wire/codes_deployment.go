package wire

// Codes of a multi-node data-parallel deployment, whose ranks the
// coordinator joins across the nodes' workers (coordinator/fleet).
const (
	// CodeDeployment (info): the worker is one node of a multi-node
	// data-parallel deployment; the message names every node and its ranks.
	CodeDeployment = "dp_deployment"
	// CodeDeploymentMismatch (warning): the deployment's nodes disagree
	// (DP size, a rank reported twice) or a node has not reported its
	// ranks; the message names the nodes.
	CodeDeploymentMismatch = "dp_deployment_mismatch"
)
