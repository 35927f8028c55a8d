// Package view holds the JSON shapes the coordinator serves: the public
// /api/v1 contract, the dashboard's live stream, and nothing else.
// Unknown numbers are null, so they are pointers here.
package view

import (
	"time"

	"heft/shared/wire"
)

// Worker states.
const (
	StatePending   = "pending"
	StateMeasuring = "measuring"
	StateAdmitted  = "admitted"
	StateHeld      = "held"
	StateOffline   = "offline"
	// StateStale is a worker whose agent is gone while nothing says its
	// engine is: it keeps its last weight until stale_weight_ttl runs out.
	StateStale = "stale"
)

// Serving reports whether a worker in state is routed by its weight:
// admitted, or stale (its agent is gone, its engine not known to be).
// A control-plane failure must not take an engine out of the gateways.
func Serving(state string) bool {
	return state == StateAdmitted || state == StateStale
}

// Warning is one health problem of a worker.
type Warning struct {
	Code     string    `json:"code"`
	Severity string    `json:"severity"`
	Message  string    `json:"message"`
	Since    time.Time `json:"since"`
}

// Rank is one data-parallel rank's KV pool.
type Rank struct {
	DPRank   int   `json:"dp_rank"`
	KVTokens int64 `json:"kv_tokens"`
}

// MeasurementPoint is one past measurement, for the dashboard's chart.
type MeasurementPoint struct {
	At            time.Time `json:"at"`
	ThroughputTPS float64   `json:"throughput_tps"`
	WarmupTPS     float64   `json:"warmup_tps"`
	Valid         bool      `json:"valid"`
	// PrefillTPS is the measurement's prefill throughput where it may be
	// used for a prefill weight.
	PrefillTPS float64 `json:"prefill_tps,omitempty"`
	// Trigger is why it was measured (registration, scheduled, on_demand)
	// and Cause what changed in the engine, when that was why.
	Trigger string `json:"trigger,omitempty"`
	Cause   string `json:"cause,omitempty"`
}

// Deployment is one node's part of a multi-node data-parallel deployment
// (fleet/deployment.go): the workers of one model whose launch args name
// the same data-parallel address.
type Deployment struct {
	// Address is the data-parallel address the nodes share (vLLM
	// data_parallel_address:rpc_port, SGLang dist_init_addr).
	Address string `json:"address"`
	// Size is the deployment's data_parallel_size, 0 when unknown.
	Size int `json:"size"`
	// StartRank and LocalRanks are this node's DP ranks: LocalRanks from
	// StartRank on (LocalRanks 0 when the args do not say).
	StartRank  int `json:"start_rank"`
	LocalRanks int `json:"local_ranks"`
	// Nodes are the deployment's nodes that have reported, by first rank.
	Nodes []string `json:"nodes"`
}

// Worker is one engine endpoint as GET /api/v1/workers shows it. The first
// block of fields is the public contract; the rest are extensions.
type Worker struct {
	ID     string `json:"id"`
	Node   string `json:"node"`
	Model  string `json:"model"`
	Engine string `json:"engine"`
	URL    string `json:"url"`
	// Address is the host:port a gateway dials: the agent's advertise URL,
	// else its URL (see fleet.Address).
	Address      string     `json:"address"`
	State        string     `json:"state"`
	Throughput   *float64   `json:"throughput_tps"`
	Weight       *float64   `json:"weight"`
	PinnedWeight *float64   `json:"pinned_weight"`
	MeasuredAt   *time.Time `json:"measured_at"`
	Ranks        []Rank     `json:"ranks"`
	Warnings     []Warning  `json:"warnings"`

	EngineVersion  string             `json:"engine_version,omitempty"`
	WarmupTPS      *float64           `json:"warmup_tps"`
	ComputedWeight *float64           `json:"computed_weight"`          // before a pin replaces it
	AdminDecision  string             `json:"admin_decision,omitempty"` // "admit" | "hold" | ""
	PoolRatio      *float64           `json:"pool_min_over_max"`
	LaunchArgs     []string           `json:"launch_args,omitempty"`
	GPUs           []wire.GPU         `json:"gpus"`
	Load           wire.Load          `json:"load"`
	Measurement    *wire.Measurement  `json:"measurement,omitempty"`
	History        []MeasurementPoint `json:"history"`
	AgentConnected bool               `json:"agent_connected"`
	LastSeen       *time.Time         `json:"last_seen"`
	ProbeStatus    string             `json:"probe_status,omitempty"` // running | deferred_busy | draining | failed | ""
	// Draining is true while the worker's agent measures it with
	// probe_busy "drain": Weight (and PrefillWeight) read 0 so every
	// gateway stops sending it new requests, ComputedWeight keeps its
	// weight, and the drain ends with the probe.
	Draining bool `json:"draining,omitempty"`
	// BelowFloor marks an admin's hold (admin_decision "hold") made with
	// below_floor: heft-sync drops the worker from the gateways even when
	// its model then serves on fewer than min_serving workers (none, if it
	// was the last). Without it, heft-sync's floor keeps a model's last
	// workers.
	BelowFloor bool `json:"below_floor,omitempty"`
	// Passive is the engine's newest passive capacity reading (its own
	// counters while saturated in service); the weight still comes from
	// the measurement, and readings below it re-measure the worker.
	Passive *wire.Passive `json:"passive,omitempty"`
	// Pace is the engine's newest pace reading (its step time at the
	// load it carries). WeightSource says what the weight counts:
	// "measured" (the newest valid measurement), "rescaled" (that
	// measurement over PaceFactor, because the engine's pace at the same
	// batch size is that much slower than when it was measured) or
	// "gpu_clock" (that measurement over ClockFactor, because its GPUs
	// report a slowdown and clock that much lower than during its burst,
	// until its pace says how much slower it runs); empty for a worker
	// without a weight from a measurement. PaceTentative: the rescale
	// rests on one reading far slower than measured; the next confirms
	// or ends it.
	Pace          *wire.Pace `json:"pace,omitempty"`
	WeightSource  string     `json:"weight_source,omitempty"`
	PaceFactor    float64    `json:"pace_factor,omitempty"`
	PaceTentative bool       `json:"pace_tentative,omitempty"`
	ClockFactor   float64    `json:"clock_factor,omitempty"`

	// ExpectedRanks is how many data-parallel ranks the engine runs, and
	// Complete whether every one has a pool in Ranks; both null when the
	// agent does not say. While Complete is false, pool_min_over_max is
	// null. MissingRanks are the ranks without a pool.
	ExpectedRanks *int            `json:"expected_ranks"`
	Complete      *bool           `json:"complete"`
	MissingRanks  []int           `json:"missing_ranks,omitempty"`
	LogSource     *wire.LogSource `json:"log_source,omitempty"` // where the agent reads the engine's log
	// Deployment is the multi-node data-parallel deployment this worker is
	// one node's part of (its ranks above are the whole deployment's); nil
	// for an engine on one node.
	Deployment *Deployment `json:"deployment,omitempty"`

	// MaxRunning is what the engine runs at once (its agent's report);
	// MaxConcurrency the most requests a gateway should have open on the
	// worker (fleet.MaxConcurrency). null while the engine's limit is
	// unknown.
	MaxRunning       *int   `json:"max_running"`
	MaxRunningSource string `json:"max_running_source,omitempty"`
	MaxConcurrency   *int   `json:"max_concurrency"`
	// AdvertiseSource says how the agent chose the address: config, url,
	// node_address or listen_address; "" when it offered none.
	AdvertiseSource string `json:"advertise_source,omitempty"`

	// What the worker can hold: its maximum model length, and the smaller
	// of that and its smallest data-parallel rank's KV pool.
	MaxModelLen      *int64 `json:"max_model_len"`
	MaxContextTokens *int64 `json:"max_context_tokens"`
	// The prefill weight: prefill throughput over the model's median, for
	// gateways that route long prompts apart; null without a valid
	// prefill measurement or outside the weight table.
	PrefillTPS            *float64 `json:"prefill_tps"`
	PrefillWeight         *float64 `json:"prefill_weight"`
	PinnedPrefillWeight   *float64 `json:"pinned_prefill_weight"`
	ComputedPrefillWeight *float64 `json:"computed_prefill_weight"`
}

// Workers is the body of GET /api/v1/workers.
type Workers struct {
	Workers []Worker `json:"workers"`
	// NextCursor, on a page that is not the last, asks for the next one
	// (?cursor=); it is absent on the last page and on an unpaged answer.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Weight kinds: the decode weight (the default) and the prefill weight.
const (
	WeightDecode  = "decode"
	WeightPrefill = "prefill"
)

// WeightEntry is one serving worker in a model's weight table: admitted,
// or stale (its agent away, still routed at its last weight).
type WeightEntry struct {
	ID      string  `json:"id"`
	Node    string  `json:"node"`
	URL     string  `json:"url"`
	Address string  `json:"address"`
	Weight  float64 `json:"weight"`
	Pinned  bool    `json:"pinned"`
	// State is the worker's state, StateAdmitted or StateStale: a weight
	// whose agent is away is shown as stale, never as fresh.
	State string `json:"state"`
	// Throughput is the measured throughput the weight comes from: decode
	// tok/s, or prompt tok/s for the prefill weight.
	Throughput *float64   `json:"throughput_tps"`
	MeasuredAt *time.Time `json:"measured_at"`
	// MaxRunning and MaxConcurrency as in Worker.
	MaxRunning       *int   `json:"max_running"`
	MaxConcurrency   *int   `json:"max_concurrency"`
	MaxContextTokens *int64 `json:"max_context_tokens"`
}

// Weights is the body of GET /api/v1/models/{model}/weights[?kind=prefill].
type Weights struct {
	Model   string        `json:"model"`
	Kind    string        `json:"kind"` // WeightDecode or WeightPrefill
	Workers []WeightEntry `json:"workers"`
}

// Error is the body of every error response.
type Error struct {
	Error string `json:"error"`
}

// Node is one node name the coordinator knows, as GET /api/v1/nodes shows
// it: its enrolment state (enrolled, unbound, pending, rejected), whether
// its agent is connected, and what its last connection said, for an admin
// deciding on a pending node. The credential itself is never shown.
type Node struct {
	Name         string    `json:"name"`
	State        string    `json:"state"`
	Credential   bool      `json:"credential"` // holds a node credential
	Connected    bool      `json:"connected"`
	Since        time.Time `json:"since"`
	LastSeen     time.Time `json:"last_seen"`
	Hostname     string    `json:"hostname,omitempty"`
	AgentVersion string    `json:"agent_version,omitempty"`
	Address      string    `json:"address,omitempty"`
	// BindApproved: an admin approved binding this unbound name; its next
	// agent that keeps a credential binds it, from any address.
	BindApproved bool `json:"bind_approved,omitempty"`
}

// Nodes is the body of GET /api/v1/nodes.
type Nodes struct {
	Nodes []Node `json:"nodes"`
}

// PendingNodes is the body of GET /api/v1/pending-nodes: the names of the
// nodes waiting for an admin's approval, in name order, and nothing else.
type PendingNodes struct {
	Nodes []string `json:"nodes"`
}
