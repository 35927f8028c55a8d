package wire

// Headers of the agent's websocket upgrade request. An agent that holds its
// node credential sends it with its node name, besides the agent token:
// the coordinator accepts the credential alone, so the shared agent token
// is needed only to enrol. The hello must then name the same node.
const (
	HeaderNode           = "X-Heft-Node"
	HeaderNodeCredential = "X-Heft-Node-Credential"
)
