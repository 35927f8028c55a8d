// Package wire defines the messages that heft-agent and heft-coordinator
// exchange over their one websocket, and the facts those messages carry.
//
// Every message is one JSON object, an Envelope, with a type, the protocol
// version, and exactly one payload. Decode is the only way in: it checks the
// version, the type, the payload and every number before anything else sees
// the message.
package wire

import (
	"slices"
	"time"
)

// ProtocolVersion is bumped on any change an older peer cannot read.
const ProtocolVersion = 1

// MaxMessageBytes is the largest message either side accepts.
const MaxMessageBytes = 1 << 20

// Message types, agent → coordinator.
const (
	TypeHello       = "hello"
	TypeSnapshot    = "snapshot"
	TypeProbeResult = "probe_result"
	TypeProbeStatus = "probe_status"
)

// Message types, coordinator → agent.
const (
	TypeWelcome      = "welcome"
	TypeCached       = "cached_measurement"
	TypeProbeRequest = "probe_request"
)

// Engine kinds.
const (
	EngineVLLM     = "vllm"
	EngineSGLang   = "sglang"
	EngineMLX      = "mlx"
	EngineLlamaCpp = "llamacpp"
	EngineOllama   = "ollama"
)

// EngineKinds lists every kind the agent knows, in a stable order.
var EngineKinds = []string{EngineVLLM, EngineSGLang, EngineMLX, EngineLlamaCpp, EngineOllama}

// Envelope is one message. Exactly the payload that matches Type is set.
type Envelope struct {
	Type    string `json:"type"`
	Version int    `json:"v"`

	Hello        *Hello             `json:"hello,omitempty"`
	Snapshot     *Snapshot          `json:"snapshot,omitempty"`
	ProbeResult  *ProbeResult       `json:"probe_result,omitempty"`
	ProbeStatus  *ProbeStatus       `json:"probe_status,omitempty"`
	Welcome      *Welcome           `json:"welcome,omitempty"`
	Cached       *CachedMeasurement `json:"cached_measurement,omitempty"`
	ProbeRequest *ProbeRequest      `json:"probe_request,omitempty"`
}

// Hello is the first message of every connection.
type Hello struct {
	Node         string `json:"node"`
	AgentVersion string `json:"agent_version"`
	Host         Host   `json:"host"`
	// NodeCredential is the credential the coordinator handed this node
	// when it enrolled; empty until then.
	NodeCredential string `json:"node_credential,omitempty"`
	// KeepsCredential says the agent stores a credential it is handed.
	// Agents from before node credentials leave it false and stay unbound.
	KeepsCredential bool `json:"keeps_credential,omitempty"`
	// Measurements are the fresh measurements this agent holds from a
	// coordinator (CachedMeasurement), at most one per capacity key and
	// MaxEngines in all. A coordinator that has no valid fresh measurement
	// of its own for a key the agent lists (it restarted on an empty
	// state) takes the agent's instead of asking for a registration burst,
	// after the checks a fresh result gets. Each is judged alone: a bad
	// one is refused with a reason and costs the hello nothing.
	Measurements []CachedMeasurement `json:"measurements,omitempty"`
}

// Host describes the machine the agent runs on.
type Host struct {
	Hostname        string `json:"hostname"`
	OS              string `json:"os"`
	Platform        string `json:"platform,omitempty"`
	PlatformVersion string `json:"platform_version,omitempty"`
	KernelVersion   string `json:"kernel_version,omitempty"`
	Arch            string `json:"arch"`
	CPUModel        string `json:"cpu_model,omitempty"`
	CPUCores        int    `json:"cpu_cores"`
	MemoryTotal     uint64 `json:"memory_total_bytes"`
	MemoryAvailable uint64 `json:"memory_available_bytes"`
	// UnifiedMemory is true on Apple silicon, where the GPU shares host memory.
	UnifiedMemory bool `json:"unified_memory,omitempty"`
}

// Snapshot is what the agent sees now. It is sent on change and as a
// heartbeat, and always whole: the coordinator replaces the previous one.
type Snapshot struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	Host Host      `json:"host"`
	GPUs []GPU     `json:"gpus"`
	// GPUError says why GPU facts are missing (no NVML, no driver), once.
	GPUError string   `json:"gpu_error,omitempty"`
	Engines  []Engine `json:"engines"`
}

// GPU is one device as NVML (or powermetrics on a Mac) reports it.
// Zero means "not reported"; Unsupported names fields the device refused.
type GPU struct {
	Index              int          `json:"index"`
	UUID               string       `json:"uuid"`
	Name               string       `json:"name"`
	MemoryTotal        uint64       `json:"memory_total_bytes"`
	MemoryFree         uint64       `json:"memory_free_bytes"`
	MemoryUsed         uint64       `json:"memory_used_bytes"`
	SMClockMHz         uint32       `json:"sm_clock_mhz"`
	SMClockMaxMHz      uint32       `json:"sm_clock_max_mhz"`
	MemClockMHz        uint32       `json:"mem_clock_mhz"`
	MemClockMaxMHz     uint32       `json:"mem_clock_max_mhz"`
	ClockEventReasons  []string     `json:"clock_event_reasons,omitempty"`
	TemperatureC       float64      `json:"temperature_c"`
	PowerDrawW         float64      `json:"power_draw_w"`
	PowerLimitW        float64      `json:"power_limit_w"`
	UtilizationPercent float64      `json:"utilization_percent"`
	Processes          []GPUProcess `json:"processes,omitempty"`
	Unsupported        []string     `json:"unsupported,omitempty"`
	// Error is set when this device could not be read; the others still are.
	Error string `json:"error,omitempty"`
}

// GPUMemory is the memory one engine's processes hold on one GPU.
type GPUMemory struct {
	UUID      string `json:"uuid"`
	UsedBytes uint64 `json:"used_bytes"`
}

// GPUProcess is a process holding memory on a GPU.
type GPUProcess struct {
	PID        int    `json:"pid"`
	Name       string `json:"name,omitempty"`
	UsedMemory uint64 `json:"used_memory_bytes"`
	// Foreign is true when the process is outside the engine's process tree.
	Foreign bool `json:"foreign,omitempty"`
}

// Engine is one inference engine endpoint beside the agent.
type Engine struct {
	Kind    string   `json:"kind"`
	URL     string   `json:"url"`
	Model   string   `json:"model,omitempty"`
	Models  []string `json:"models,omitempty"`
	Version string   `json:"version,omitempty"`
	Ready   bool     `json:"ready"`
	// Error says why the engine could not be read (unreachable, not JSON...).
	Error string `json:"error,omitempty"`

	// CapacityKey identifies what was measured: node + kind + model +
	// normalised launch arguments. A worker in the coordinator is one key.
	CapacityKey string `json:"capacity_key,omitempty"`
	// LaunchArgs are normalised flag=value pairs, sorted by flag.
	LaunchArgs       []string `json:"launch_args,omitempty"`
	LaunchArgsSource string   `json:"launch_args_source,omitempty"` // cmdline | log | server_info

	PID      int      `json:"pid,omitempty"`
	GPUUUIDs []string `json:"gpu_uuids,omitempty"`
	// ForeignProcesses hold memory on the engine's GPUs from outside its tree.
	ForeignProcesses []GPUProcess `json:"foreign_processes,omitempty"`
	// GPUMemory is what the engine's processes hold on each GPU now, for
	// the GPUs where they hold any (an engine that unloaded its model,
	// as Ollama does when idle, holds none).
	GPUMemory []GPUMemory `json:"gpu_memory,omitempty"`

	Load Load `json:"load"`
	// MaxRunning is how many sequences the engine runs at once, its
	// data-parallel ranks together (vLLM --max-num-seqs, SGLang
	// --max-running-requests, llama.cpp slots, Ollama OLLAMA_NUM_PARALLEL,
	// mlx-lm --decode-concurrency, per rank × ranks); 0 when unknown.
	// MaxRunningSource says where it was read, e.g. "launch_args
	// max_num_seqs=16 × 2 ranks" or "default".
	MaxRunning       int    `json:"max_running,omitempty"`
	MaxRunningSource string `json:"max_running_source,omitempty"`

	// AdvertiseURL is the engine's URL as a gateway should dial it: the
	// configured advertise_url, else one the agent derived (see
	// AdvertiseSource); empty when the agent has none to offer. URL stays
	// what the agent itself dials.
	AdvertiseURL string `json:"advertise_url,omitempty"`
	// AdvertiseSource is how AdvertiseURL was chosen: "config", "url"
	// (the engine URL names a routable host), "node_address" (the engine
	// listens on every interface; the node's primary address was offered)
	// or "listen_address" (the one address the engine listens on).
	AdvertiseSource string `json:"advertise_source,omitempty"`
	// Listen lists the local addresses the engine's socket is bound to
	// ("0.0.0.0:8000"), when the agent could see them.
	Listen []string `json:"listen,omitempty"`

	// Ranks are the KV pools of each data-parallel rank, sorted by DPRank.
	Ranks       []Rank    `json:"ranks,omitempty"`
	RanksSource string    `json:"ranks_source,omitempty"` // log path, "metrics", "server_info"
	RanksAt     time.Time `json:"ranks_at,omitzero"`
	// ExpectedRanks is how many data-parallel ranks the engine runs, as its
	// launch arguments or its log's rank markers say; 0 when unknown.
	ExpectedRanks int `json:"expected_ranks,omitempty"`
	// Complete says whether Ranks holds a pool for every expected rank:
	// false while one has none (still starting, failed, or on another
	// node), nil when the agent does not say (an older agent), which is
	// read as before: the ranks sent are all there are.
	Complete *bool `json:"complete,omitempty"`
	// MissingRanks are the expected ranks without a pool, ascending.
	MissingRanks []int `json:"missing_ranks,omitempty"`
	// PoolCheck is a second reading of the pools from the engine's own
	// endpoints, where they are truthful, sent when Ranks come from the
	// log: a disagreement means one of the two is not this engine's now.
	PoolCheck *PoolCheck `json:"pool_check,omitempty"`
	// LogSource says where the engine's start-up log is read from and how
	// that goes; nil when no log is configured.
	LogSource *LogSource `json:"log_source,omitempty"`

	// MaxModelLen is the longest sequence (prompt + output) the engine
	// accepts for its model: vLLM's max_model_len, SGLang's context_length,
	// a llama.cpp slot's n_ctx, Ollama's context_length; 0 = unknown.
	MaxModelLen       int64  `json:"max_model_len,omitempty"`
	MaxModelLenSource string `json:"max_model_len_source,omitempty"` // v1_models | server_info | props | api_ps | cmdline | log

	// Passive is the engine's newest passive capacity reading: what it
	// delivered over a window in which every rank ran at least the probe's
	// per-rank burst with work waiting; nil until there is one.
	Passive *Passive `json:"passive,omitempty"`
	// Pace is the engine's newest pace reading: how long a step took for
	// the requests it was running, at whatever load; nil until one.
	Pace *Pace `json:"pace,omitempty"`
}

// Pace is the engine's step time at the load it carried over a window,
// from its own counters (vLLM's and SGLang's inter-token latency
// histogram, the generated-tokens counter), below saturation too. Below
// saturation delivered tokens equal the offered load, whatever the
// engine's speed; the time between two tokens of a request at a given
// batch size does not: an engine that runs at half speed takes twice as
// long at every batch size. The coordinator compares it with what the
// engine showed at the same batch size while its measurement held.
type Pace struct {
	At            time.Time `json:"at"`             // end of the window
	WindowSeconds float64   `json:"window_seconds"` // its length
	// SecondsPerToken is the mean time between two tokens of one
	// request over the window: the histogram's sum over its count.
	SecondsPerToken float64 `json:"seconds_per_token"`
	// Batch is the mean number of requests decoding per rank over the
	// window: tokens per second × SecondsPerToken / ranks (Little's law).
	Batch float64 `json:"batch"`
	// TokenBatch is the mean number decoding per rank as the window's
	// tokens saw it: Little's law over each interval between the agent's
	// samples, weighted by the interval's tokens. SecondsPerToken is a
	// mean over tokens, so this is the batch it belongs to: idle seconds
	// lower Batch (traffic in bursts reads as a small batch at a busy
	// batch's pace) but not TokenBatch. 0 where the engine's histogram
	// does not grow as tokens are sent (older SGLang, llama.cpp), and from
	// older agents: Batch stands then.
	TokenBatch    float64 `json:"token_batch,omitempty"`
	ThroughputTPS float64 `json:"throughput_tps"` // tokens generated / window
	// PromptTPS is the prompt tokens the engine computed per second over
	// the window, its prefix cache's hits excluded; 0 where its counters
	// do not say. Prefill shares the engine's steps with decoding and
	// stretches the time between tokens by the share of time it takes,
	// which the coordinator reads against the measured prefill rate.
	PromptTPS float64 `json:"prompt_tps,omitempty"`
	// Recent is the window's newest half read alone (about half the
	// window, from the sample where the next window starts); nil where it
	// held too few tokens, and on the reading a window that started over
	// gives at half its length.
	Recent *PaceSpan `json:"recent,omitempty"`
}

// PaceSpan is part of a pace reading's window, with the same figures.
type PaceSpan struct {
	WindowSeconds   float64 `json:"window_seconds"`
	SecondsPerToken float64 `json:"seconds_per_token"`
	Batch           float64 `json:"batch"`
	TokenBatch      float64 `json:"token_batch,omitempty"`
	PromptTPS       float64 `json:"prompt_tps,omitempty"`
}

// Passive is a capacity measurement at load with no burst sent: the
// engine's own generated-tokens counter over a window of saturation.
type Passive struct {
	At            time.Time `json:"at"`             // end of the window
	WindowSeconds float64   `json:"window_seconds"` // its length
	ThroughputTPS float64   `json:"throughput_tps"` // tokens generated / window
	// Concurrency is the fewest requests running at once in the window,
	// over every rank; Spread is (max − min) / mean of the rates between
	// the window's samples.
	Concurrency int     `json:"concurrency"`
	Spread      float64 `json:"spread"`
}

// PoolCheck is the KV pools per rank as the engine's endpoints report them.
type PoolCheck struct {
	Source string `json:"source"` // "metrics", "v1_loads", "server_info"
	Ranks  []Rank `json:"ranks"`
}

// LogSource is the state of one engine's log source.
type LogSource struct {
	// Spec is the configured source (a path, a glob, journald:UNIT,
	// docker:CONTAINER, k8s:NAMESPACE/POD/CONTAINER).
	Spec string `json:"spec"`
	// Resolved is what is read now (a file, a unit's invocation, a
	// container), Via how, Wrapper the wrapper found on its lines.
	Resolved string `json:"resolved,omitempty"`
	Via      string `json:"via,omitempty"`
	Wrapper  string `json:"wrapper,omitempty"`
	// Lines counts the engine lines read; Skipped the lines dropped as
	// not the engine's (cut, untagged, binary).
	Lines   int64 `json:"lines"`
	Skipped int64 `json:"skipped,omitempty"`
	// Error says why the source cannot be read now; "" once lines come.
	Error string `json:"error,omitempty"`
}

// DataParallelRanks is how many data-parallel ranks the engine runs, as
// its launch arguments, log, pools or per-rank load say; 1 when none does.
func (e Engine) DataParallelRanks() int {
	return max(1, e.ExpectedRanks, len(e.Ranks), len(e.Load.Ranks))
}

// MaxContextTokens is the longest sequence the worker can really hold: its
// maximum model length, or the smallest data-parallel rank's KV pool when
// that is smaller (round-robin dealing can put any request on the smallest
// rank). With only one of the two known it is that one; 0 = unknown.
// While the pools are incomplete (Complete false) it is taken over the
// ranks known, and a missing rank may hold less.
func (e Engine) MaxContextTokens() int64 {
	smallest := int64(0)
	for i, r := range e.Ranks {
		if i == 0 || r.KVTokens < smallest {
			smallest = r.KVTokens
		}
	}
	switch {
	case e.MaxModelLen <= 0:
		return max(smallest, 0)
	case smallest <= 0:
		return e.MaxModelLen
	}
	return min(e.MaxModelLen, smallest)
}

// Load is how busy an engine is right now.
type Load struct {
	Known   bool       `json:"known"`
	Running int        `json:"running"`
	Waiting int        `json:"waiting"`
	KVUsage float64    `json:"kv_usage"` // 0..1, the busiest rank
	Ranks   []RankLoad `json:"ranks,omitempty"`
	// StaleSeconds, where set, is how long this load and the engine's
	// token counters have stood still together, 30 s or more: requests
	// running make tokens at every step, so it is a load the engine
	// stopped updating (vLLM keeps its last after every request is
	// aborted), not work.
	StaleSeconds float64 `json:"stale_seconds,omitempty"`
}

// Same reports whether l and o read the same requests and KV usage,
// rank by rank (StaleSeconds aside).
func (l Load) Same(o Load) bool {
	return l.Known == o.Known && l.Running == o.Running && l.Waiting == o.Waiting && l.KVUsage == o.KVUsage &&
		slices.Equal(l.Ranks, o.Ranks)
}

// RankLoad is the load of one data-parallel rank.
type RankLoad struct {
	DPRank  int     `json:"dp_rank"`
	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
	KVUsage float64 `json:"kv_usage"`
}

// Rank is one data-parallel rank's KV pool.
type Rank struct {
	DPRank   int   `json:"dp_rank"`
	KVTokens int64 `json:"kv_tokens"`
}

// ProbeResult carries one measurement (or the failure of one) for a
// capacity key, answering a ProbeRequest.
type ProbeResult struct {
	RequestID   string      `json:"request_id,omitempty"`
	Measurement Measurement `json:"measurement"`
}

// Measurement is the outcome of one probe: a warm-up burst and a measured
// burst. See Valid for when its throughput may be used.
type Measurement struct {
	CapacityKey string `json:"capacity_key"`
	Node        string `json:"node,omitempty"`
	EngineKind  string `json:"engine_kind"`
	EngineURL   string `json:"engine_url"`
	Model       string `json:"model"`

	ThroughputTPS float64 `json:"throughput_tps"`
	WarmupTPS     float64 `json:"warmup_tps"`
	OutputTokens  int     `json:"output_tokens"`
	// ExpectedTokens is requests × tokens per request.
	ExpectedTokens int     `json:"expected_tokens"`
	WallSeconds    float64 `json:"wall_seconds"`
	Requests       int     `json:"requests"`
	Concurrency    int     `json:"concurrency"`
	TokensPerReq   int     `json:"tokens_per_request"`
	Prompt         string  `json:"prompt,omitempty"`

	DecodeTPSP50 float64 `json:"decode_tps_p50"`
	DecodeTPSP95 float64 `json:"decode_tps_p95"`
	TTFTP50      float64 `json:"ttft_seconds_p50"`
	TTFTP95      float64 `json:"ttft_seconds_p95"`

	// GPU clocks sampled during the measured burst.
	SMClockMinMHz     float64  `json:"sm_clock_min_mhz,omitempty"`
	SMClockMedianMHz  float64  `json:"sm_clock_median_mhz,omitempty"`
	SMClockMaxMHz     float64  `json:"sm_clock_max_mhz,omitempty"`
	ClockEventReasons []string `json:"clock_event_reasons,omitempty"`
	// GPUMemory is the most the engine's processes held on each of its
	// GPUs during the measured burst: what the engine needs there to
	// carry the burst. Empty where the agent cannot see which GPU
	// processes are the engine's.
	GPUMemory []GPUMemory `json:"gpu_memory,omitempty"`

	LoadBefore Load `json:"load_before"`
	// Busy records that the engine had work in flight when an on-demand
	// probe started anyway (agents before probe_busy; today's never
	// measure a busy engine).
	Busy bool `json:"busy,omitempty"`
	// Ranks is how many data-parallel ranks the burst was sized for:
	// Concurrency is the per-rank burst times Ranks, so every engine
	// instance is measured at the same load. 0 from older agents.
	Ranks int `json:"ranks,omitempty"`
	// BusyWaitSeconds is how long the probe waited for the engine to
	// have no request running or waiting before its bursts.
	BusyWaitSeconds float64 `json:"busy_wait_seconds,omitempty"`
	// Drained says the worker was drained at the gateways (probe_busy
	// "drain") while the probe waited and measured.
	Drained bool `json:"drained,omitempty"`
	// EngineGeneratedTokens is what the engine's own generated-tokens
	// counter grew by over the measured burst; 0 when it was not read.
	// More than the burst received means other traffic shared the engine,
	// and such a burst is never reported as a measurement.
	EngineGeneratedTokens int64 `json:"engine_generated_tokens,omitempty"`
	// Complete is false when the engine returned fewer (or more) tokens
	// than asked, or usage and stream disagreed.
	Complete bool `json:"complete"`
	// Failure is a warning code (probe_failed, probe_incomplete_output,
	// engine_unreachable) when the measurement is not valid; Problems says why.
	Failure  string   `json:"failure,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// Implausible says why the numbers are beyond what the worker could
	// produce (tokens faster than any engine streams them, a throughput
	// far above its peers' or its GPUs'); empty when they are plausible.
	// The agent's probe sets it for token timing, the coordinator adds
	// its own checks; such a measurement holds its worker until an admin
	// admits it.
	Implausible string `json:"implausible,omitempty"`

	Trigger string `json:"trigger,omitempty"` // registration | scheduled | on_demand | cli
	// Cause is the probe request's Cause: what changed in the engine.
	Cause      string    `json:"cause,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`

	// Prefill is the prefill burst sent after the decode burst in the same
	// probe; nil when none was sent (an agent told not to, or an older one).
	// Its failure leaves the decode measurement valid.
	Prefill *Prefill `json:"prefill,omitempty"`
}

// Valid reports whether the measurement may be used for a weight. An
// engine that cannot be told an exact length (mlx-lm, Ollama) gives a valid
// but incomplete measurement; one that could and still fell short has a
// Failure and is not valid.
func (m *Measurement) Valid() bool {
	return m.Failure == "" && m.ThroughputTPS > 0 && m.OutputTokens > 0
}

// PrefillValid reports whether the measurement's prefill part may be used
// for a prefill weight: the decode part is valid too (a worker is admitted
// on its decode measurement), and the prefill burst read every prompt as
// sent.
func (m *Measurement) PrefillValid() bool {
	p := m.Prefill
	return m.Valid() && p != nil && p.Failure == "" && p.ThroughputTPS > 0 && p.PromptTokens > 0
}

// Prefill is how fast an engine reads long prompts: a warm-up burst and a
// measured burst of concurrent chat requests, each with a long prompt that
// begins with a unique random prefix and asks for one output token.
// ThroughputTPS is the measured burst's prompt tokens over its wall time.
type Prefill struct {
	ThroughputTPS float64 `json:"prefill_tps"`
	WarmupTPS     float64 `json:"warmup_tps"`
	// PromptTokens is what the measured burst's requests read, from usage
	// (or the engine's tokenizer, see TokenSource).
	PromptTokens int `json:"prompt_tokens"`
	// ExpectedPromptTokens is what the prompts sent hold, by the engine's
	// tokenizer where it has one, else by heft's estimate.
	ExpectedPromptTokens int     `json:"expected_prompt_tokens"`
	WallSeconds          float64 `json:"wall_seconds"`
	// PromptLength is the tokens per prompt asked for: the configured
	// length, or less where the worker cannot hold it.
	PromptLength int     `json:"prompt_length"`
	Requests     int     `json:"requests"`
	Concurrency  int     `json:"concurrency"`
	TTFTP50      float64 `json:"ttft_seconds_p50"`
	TTFTP95      float64 `json:"ttft_seconds_p95"`
	// CachedTokens are prompt tokens the engine says its cache served.
	CachedTokens int `json:"cached_tokens,omitempty"`
	// TokenSource says where PromptTokens came from: "usage" or "tokenizer".
	TokenSource string `json:"token_source,omitempty"`
	// Complete is true when every request read its whole prompt and
	// said so in usage.
	Complete bool `json:"complete"`
	// Failure is set when the prefill part is not valid: one of the
	// Prefill* reasons, probe_incomplete_output (no prompt usage and no
	// tokenizer) or probe_failed; Problems says why.
	Failure  string   `json:"failure,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// Probe states reported in ProbeStatus.
const (
	ProbeRunning      = "running"
	ProbeDeferredBusy = "deferred_busy"
	ProbeFailed       = "failed"
	// ProbeDraining: the engine is busy and the agent's probe_busy is
	// "drain"; the coordinator sets the worker's gateway weight to 0
	// until the probe's result or another status comes.
	ProbeDraining = "draining"
)

// ProbeStatus tells the coordinator what became of a probe request.
type ProbeStatus struct {
	RequestID   string `json:"request_id,omitempty"`
	CapacityKey string `json:"capacity_key"`
	State       string `json:"state"`
	Message     string `json:"message,omitempty"`
}

// Welcome answers Hello.
type Welcome struct {
	CoordinatorVersion string `json:"coordinator_version"`
	// SnapshotSeconds is how often the agent should send a heartbeat snapshot.
	SnapshotSeconds int `json:"snapshot_seconds"`
	// NodeCredential, when set, is this node's new credential: the agent
	// keeps it and presents it in every later hello.
	NodeCredential string `json:"node_credential,omitempty"`
}

// CachedMeasurement hands the agent the coordinator's fresh measurement
// for a capacity key, so a reconnect costs no burst: on each connection,
// and after each valid result the coordinator stores. The agent keeps it
// and offers it in its next Hello (Hello.Measurements), so a coordinator
// that lost its state costs no burst either.
type CachedMeasurement struct {
	Measurement Measurement `json:"measurement"`
	ExpiresAt   time.Time   `json:"expires_at"`
}

// Probe request reasons.
const (
	ReasonRegistration = "registration"
	ReasonScheduled    = "scheduled"
	ReasonOnDemand     = "on_demand"
)

// ProbeRequest asks the agent to measure one engine. Scheduled requests
// are deferred while the engine is busy; on-demand ones run anyway.
type ProbeRequest struct {
	RequestID   string `json:"request_id"`
	CapacityKey string `json:"capacity_key"`
	Reason      string `json:"reason"`
	// Cause says what made the coordinator ask beyond Reason: the engine
	// changed under the same capacity key ("engine_restarted: pid 41 →
	// 97", "gpu_set_changed: ..."). The agent copies it into the
	// measurement, so each trigger is named in the worker's history.
	Cause string `json:"cause,omitempty"`
	// IdleOnly asks the agent to measure only an idle engine: a busy one
	// is deferred at once, whatever its probe_busy, never waited for or
	// drained. The coordinator sets it when the worker's weight already
	// follows what the engine delivers (a pace rescale): taking the worker
	// out of the gateways would cost its users more than the measurement
	// gains them. An agent that predates the field drains as before.
	IdleOnly bool `json:"idle_only,omitempty"`
}

// Private websocket close codes (4000–4999) the coordinator sends to agents.
const (
	// CloseSuperseded: a newer connection from the same node took over;
	// most likely two agents run with one node name.
	CloseSuperseded = 4001
	// CloseProtocolVersion: the agent speaks another protocol version;
	// reconnecting will not help until one side is upgraded.
	CloseProtocolVersion = 4002
	// CloseSlowConsumer: the agent did not read fast enough and its
	// outgoing queue filled.
	CloseSlowConsumer = 4003
	// CloseNodeCredential: the node name is enrolled and the connection
	// did not present its credential; only the node that holds it, or an
	// admin releasing the name, can change that.
	CloseNodeCredential = 4004
	// CloseNodePending: the node awaits an admin's approval; the agent
	// keeps the credential it was handed and retries slowly.
	CloseNodePending = 4005
	// CloseLimit: the agent sent more than the coordinator keeps (node
	// records, capacity keys); the reason says which bound.
	CloseLimit = 4006
)

// How Engine.AdvertiseURL was chosen.
const (
	AdvertiseConfig        = "config"
	AdvertiseURLHost       = "url"
	AdvertiseNodeAddress   = "node_address"
	AdvertiseListenAddress = "listen_address"
)

// MaxCredentialBytes bounds a node credential on the wire.
const MaxCredentialBytes = 128
