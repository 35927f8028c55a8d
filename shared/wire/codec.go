package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"heft/shared/address"
)

// Limits on what one message may hold. They bound memory per agent and
// keep a confused or hostile peer from growing the coordinator's state.
const (
	MaxGPUs         = 64
	MaxEngines      = 32
	MaxRanks        = 1024
	MaxProcesses    = 1024
	MaxListItems    = 256
	MaxStringBytes  = 4096
	MaxProblemCount = 64
	// MaxRunning bounds Engine.MaxRunning: more sequences at once than
	// any engine runs.
	MaxRunning = 1 << 20
	// MaxRequests bounds one rank's running or waiting requests in a
	// Load, as the agent bounds what it reads from an engine; a load's
	// totals sum at most MaxRanks of them.
	MaxRequests = 1 << 24
	// MaxKVUsage bounds a Load's kv_usage, the fraction of a KV pool in
	// use: 0..1 by construction in every engine heft reads (vLLM's
	// kv_cache_usage_perc is 1 - free/total blocks, SGLang's token_usage
	// used/max tokens; heft's agent clamps at 1). A little over 1 (a
	// rounding, or a reader that counts pending tokens as used) passes,
	// shown as sent; more than twice the pool is no fraction of it (a
	// percentage sent as one, say) and refuses the message.
	MaxKVUsage = 2
	// MaxStaleSeconds bounds a Load's stale_seconds, how long an engine's
	// load and token counters stood still together: at most as long as
	// the agent ran, which may be months for an idle engine whose agent
	// could not reach a coordinator (no probe then stirs it), so only a
	// value past ten years, which no uptime reaches, is refused.
	MaxStaleSeconds = 10 * 365 * 24 * 60 * 60
)

// ErrVersion is returned for a message from an older or newer peer.
var ErrVersion = errors.New("unsupported protocol version")

// ErrInvalid wraps every validation failure.
var ErrInvalid = errors.New("invalid message")

// Encode builds an envelope for payload and marshals it. payload must be one
// of the payload pointer types; its type decides the message type.
func Encode(payload any) ([]byte, error) {
	env := Envelope{Version: ProtocolVersion}
	switch p := payload.(type) {
	case *Hello:
		env.Type, env.Hello = TypeHello, p
	case *Snapshot:
		env.Type, env.Snapshot = TypeSnapshot, p
	case *ProbeResult:
		env.Type, env.ProbeResult = TypeProbeResult, p
	case *ProbeStatus:
		env.Type, env.ProbeStatus = TypeProbeStatus, p
	case *Welcome:
		env.Type, env.Welcome = TypeWelcome, p
	case *CachedMeasurement:
		env.Type, env.Cached = TypeCached, p
	case *ProbeRequest:
		env.Type, env.ProbeRequest = TypeProbeRequest, p
	default:
		return nil, fmt.Errorf("wire: cannot encode %T", payload)
	}
	if err := env.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// Decode parses and validates one message. Errors wrap ErrVersion or
// ErrInvalid so a caller can pick a close reason.
func Decode(data []byte) (*Envelope, error) {
	if len(data) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: message of %d bytes exceeds %d", ErrInvalid, len(data), MaxMessageBytes)
	}
	// Peek at the version first so a newer peer gets a version error even
	// when its payload no longer fits our structs.
	var head struct {
		Type    string `json:"type"`
		Version *int   `json:"v"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrInvalid, err)
	}
	if head.Version == nil {
		return nil, fmt.Errorf("%w: missing protocol version", ErrInvalid)
	}
	if *head.Version != ProtocolVersion {
		return nil, fmt.Errorf("%w: peer speaks v%d, this side v%d", ErrVersion, *head.Version, ProtocolVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var env Envelope
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := env.Validate(); err != nil {
		return nil, err
	}
	return &env, nil
}

// Validate checks that exactly the payload named by Type is present and
// that it holds sane values.
func (e *Envelope) Validate() error {
	if e.Version != ProtocolVersion {
		return fmt.Errorf("%w: peer speaks v%d, this side v%d", ErrVersion, e.Version, ProtocolVersion)
	}
	set := 0
	for _, p := range []bool{e.Hello != nil, e.Snapshot != nil, e.ProbeResult != nil, e.ProbeStatus != nil,
		e.Welcome != nil, e.Cached != nil, e.ProbeRequest != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return invalid("message %q must carry exactly one payload, has %d", e.Type, set)
	}
	var err error
	switch e.Type {
	case TypeHello:
		err = need(e.Hello != nil, e.Type, func() error { return e.Hello.Validate() })
	case TypeSnapshot:
		err = need(e.Snapshot != nil, e.Type, func() error { return e.Snapshot.Validate() })
	case TypeProbeResult:
		err = need(e.ProbeResult != nil, e.Type, func() error { return e.ProbeResult.Validate() })
	case TypeProbeStatus:
		err = need(e.ProbeStatus != nil, e.Type, func() error { return e.ProbeStatus.Validate() })
	case TypeWelcome:
		err = need(e.Welcome != nil, e.Type, func() error { return e.Welcome.Validate() })
	case TypeCached:
		err = need(e.Cached != nil, e.Type, func() error { return e.Cached.Measurement.Validate() })
	case TypeProbeRequest:
		err = need(e.ProbeRequest != nil, e.Type, func() error { return e.ProbeRequest.Validate() })
	default:
		return invalid("unknown message type %q", e.Type)
	}
	return err
}

func need(present bool, typ string, validate func() error) error {
	if !present {
		return invalid("message %q lacks its %q payload", typ, typ)
	}
	return validate()
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Validate checks a Hello.
func (h *Hello) Validate() error {
	if err := checkName("hello.node", h.Node); err != nil {
		return err
	}
	if err := checkString("hello.agent_version", h.AgentVersion); err != nil {
		return err
	}
	if len(h.NodeCredential) > MaxCredentialBytes {
		return invalid("hello.node_credential is %d bytes, at most %d", len(h.NodeCredential), MaxCredentialBytes)
	}
	// Only the count: the coordinator judges each offered measurement
	// alone, so a bad one is refused by itself and never refuses the
	// node's connection.
	if len(h.Measurements) > MaxEngines {
		return invalid("hello offers %d measurements, at most %d", len(h.Measurements), MaxEngines)
	}
	return h.Host.Validate()
}

// Validate checks host facts.
func (h *Host) Validate() error {
	for name, s := range map[string]string{"host.hostname": h.Hostname, "host.os": h.OS, "host.platform": h.Platform,
		"host.platform_version": h.PlatformVersion, "host.kernel_version": h.KernelVersion, "host.arch": h.Arch, "host.cpu_model": h.CPUModel} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	if h.CPUCores < 0 {
		return invalid("host.cpu_cores is negative")
	}
	return nil
}

// Validate checks a Snapshot.
func (s *Snapshot) Validate() error {
	if err := checkName("snapshot.node", s.Node); err != nil {
		return err
	}
	if err := s.Host.Validate(); err != nil {
		return err
	}
	if err := checkString("snapshot.gpu_error", s.GPUError); err != nil {
		return err
	}
	if len(s.GPUs) > MaxGPUs {
		return invalid("snapshot has %d GPUs, at most %d", len(s.GPUs), MaxGPUs)
	}
	if len(s.Engines) > MaxEngines {
		return invalid("snapshot has %d engines, at most %d", len(s.Engines), MaxEngines)
	}
	for i := range s.GPUs {
		if err := s.GPUs[i].Validate(); err != nil {
			return fmt.Errorf("gpu %d: %w", i, err)
		}
	}
	for i := range s.Engines {
		if err := s.Engines[i].Validate(); err != nil {
			return fmt.Errorf("engine %d: %w", i, err)
		}
	}
	return nil
}

// Validate checks one GPU's facts.
func (g *GPU) Validate() error {
	for name, s := range map[string]string{"gpu.uuid": g.UUID, "gpu.name": g.Name, "gpu.error": g.Error} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	if g.Index < 0 {
		return invalid("gpu.index is negative")
	}
	for name, v := range map[string]float64{"gpu.temperature_c": g.TemperatureC, "gpu.power_draw_w": g.PowerDrawW,
		"gpu.power_limit_w": g.PowerLimitW, "gpu.utilization_percent": g.UtilizationPercent} {
		if err := checkNumber(name, v); err != nil {
			return err
		}
	}
	if err := checkStrings("gpu.clock_event_reasons", g.ClockEventReasons); err != nil {
		return err
	}
	if err := checkStrings("gpu.unsupported", g.Unsupported); err != nil {
		return err
	}
	return checkProcesses("gpu.processes", g.Processes)
}

func checkProcesses(name string, ps []GPUProcess) error {
	if len(ps) > MaxProcesses {
		return invalid("%s has %d entries, at most %d", name, len(ps), MaxProcesses)
	}
	for _, p := range ps {
		if p.PID < 0 {
			return invalid("%s: negative pid", name)
		}
		if err := checkString(name+".name", p.Name); err != nil {
			return err
		}
	}
	return nil
}

// checkGPUMemory checks a list of per-GPU memory: bounded, and each GPU
// named once.
func checkGPUMemory(name string, list []GPUMemory) error {
	if len(list) > MaxListItems {
		return invalid("%s has %d items, at most %d", name, len(list), MaxListItems)
	}
	seen := make(map[string]bool, len(list))
	for _, g := range list {
		if g.UUID == "" {
			return invalid("%s: a GPU without a uuid", name)
		}
		if err := checkString(name+".uuid", g.UUID); err != nil {
			return err
		}
		if seen[g.UUID] {
			return invalid("%s names GPU %q twice", name, g.UUID)
		}
		seen[g.UUID] = true
	}
	return nil
}

// Validate checks one engine's facts.
func (e *Engine) Validate() error {
	if p := e.Passive; p != nil {
		for name, v := range map[string]float64{"window_seconds": p.WindowSeconds, "throughput_tps": p.ThroughputTPS, "spread": p.Spread} {
			if err := checkNumber("engine.passive."+name, v); err != nil {
				return err
			}
		}
		if p.Concurrency < 0 {
			return invalid("engine.passive.concurrency is negative")
		}
	}
	if p := e.Pace; p != nil {
		for name, v := range map[string]float64{"window_seconds": p.WindowSeconds, "seconds_per_token": p.SecondsPerToken,
			"batch": p.Batch, "token_batch": p.TokenBatch, "throughput_tps": p.ThroughputTPS, "prompt_tps": p.PromptTPS} {
			if err := checkNumber("engine.pace."+name, v); err != nil {
				return err
			}
		}
		if r := p.Recent; r != nil {
			for name, v := range map[string]float64{"window_seconds": r.WindowSeconds, "seconds_per_token": r.SecondsPerToken,
				"batch": r.Batch, "token_batch": r.TokenBatch, "prompt_tps": r.PromptTPS} {
				if err := checkNumber("engine.pace.recent."+name, v); err != nil {
					return err
				}
			}
		}
	}
	// A kind this build does not know is accepted, so agents can be
	// upgraded before coordinators; it must still look like a kind name.
	if !slices.Contains(EngineKinds, e.Kind) && !IsKindName(e.Kind) {
		return invalid("engine.kind %q is not a kind name (lower-case letters, digits, '-' and '_', at most %d); known kinds: %s",
			e.Kind, maxKindName, strings.Join(EngineKinds, ", "))
	}
	for name, s := range map[string]string{"engine.url": e.URL, "engine.model": e.Model, "engine.version": e.Version,
		"engine.error": e.Error, "engine.capacity_key": e.CapacityKey, "engine.launch_args_source": e.LaunchArgsSource,
		"engine.ranks_source": e.RanksSource, "engine.max_running_source": e.MaxRunningSource,
		"engine.advertise_url": e.AdvertiseURL, "engine.advertise_source": e.AdvertiseSource} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	if e.URL == "" {
		return invalid("engine.url is empty")
	}
	if e.AdvertiseURL != "" {
		if _, err := address.CheckURL("engine.advertise_url", e.AdvertiseURL, "http", "https"); err != nil {
			return invalid("%v", err)
		}
	}
	if e.MaxRunning < 0 || e.MaxRunning > MaxRunning {
		return invalid("engine.max_running %d is outside 0..%d", e.MaxRunning, MaxRunning)
	}
	for name, list := range map[string][]string{"engine.models": e.Models, "engine.launch_args": e.LaunchArgs,
		"engine.gpu_uuids": e.GPUUUIDs, "engine.listen": e.Listen} {
		if err := checkStrings(name, list); err != nil {
			return err
		}
	}
	if e.PID < 0 {
		return invalid("engine.pid is negative")
	}
	if e.MaxModelLen < 0 {
		return invalid("engine.max_model_len is negative")
	}
	if err := checkString("engine.max_model_len_source", e.MaxModelLenSource); err != nil {
		return err
	}
	if err := checkProcesses("engine.foreign_processes", e.ForeignProcesses); err != nil {
		return err
	}
	if err := checkGPUMemory("engine.gpu_memory", e.GPUMemory); err != nil {
		return err
	}
	if err := e.Load.Validate(); err != nil {
		return err
	}
	if err := CheckRanks(e.Ranks); err != nil {
		return err
	}
	if err := CheckCompleteness(e.Ranks, e.ExpectedRanks, e.Complete, e.MissingRanks); err != nil {
		return err
	}
	if p := e.PoolCheck; p != nil {
		if err := checkString("engine.pool_check.source", p.Source); err != nil {
			return err
		}
		if err := CheckRanks(p.Ranks); err != nil {
			return fmt.Errorf("engine.pool_check: %w", err)
		}
	}
	if l := e.LogSource; l != nil {
		for name, s := range map[string]string{"engine.log_source.spec": l.Spec, "engine.log_source.resolved": l.Resolved,
			"engine.log_source.via": l.Via, "engine.log_source.wrapper": l.Wrapper, "engine.log_source.error": l.Error} {
			if err := checkString(name, s); err != nil {
				return err
			}
		}
		if l.Lines < 0 || l.Skipped < 0 {
			return invalid("engine.log_source counts are negative")
		}
	}
	return nil
}

// CheckCompleteness checks that an engine's expected ranks, missing ranks
// and completeness agree with each other and with its ranks.
func CheckCompleteness(ranks []Rank, expected int, complete *bool, missing []int) error {
	n := expected
	if n < 0 || n > MaxRanks {
		return invalid("engine.expected_ranks %d is not within 0..%d", n, MaxRanks)
	}
	if len(missing) > MaxRanks {
		return invalid("engine.missing_ranks has %d items, at most %d", len(missing), MaxRanks)
	}
	have := make(map[int]bool, len(ranks))
	present := 0
	for _, r := range ranks {
		have[r.DPRank] = true
		if r.DPRank < n {
			present++
		}
	}
	for i, m := range missing {
		switch {
		case m < 0 || m >= n:
			return invalid("engine.missing_ranks holds %d, not a rank below expected_ranks %d", m, n)
		case i > 0 && m <= missing[i-1]:
			return invalid("engine.missing_ranks is not ascending without repeats")
		case have[m]:
			return invalid("engine.missing_ranks holds %d, which has a pool", m)
		}
	}
	if complete == nil {
		return nil
	}
	if *complete {
		if len(ranks) == 0 || len(missing) > 0 || present < n {
			return invalid("engine.complete is true but %d of %d expected ranks have a pool", present, n)
		}
		return nil
	}
	if n == 0 || present == n {
		return invalid("engine.complete is false but no expected rank lacks a pool (expected_ranks %d)", n)
	}
	return nil
}

// CheckRanks validates a list of KV pools: bounded, non-negative, unique ranks.
func CheckRanks(ranks []Rank) error {
	if len(ranks) > MaxRanks {
		return invalid("%d ranks, at most %d", len(ranks), MaxRanks)
	}
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r.DPRank < 0 || r.KVTokens < 0 {
			return invalid("rank %d has negative values", r.DPRank)
		}
		if seen[r.DPRank] {
			return invalid("dp_rank %d appears twice", r.DPRank)
		}
		seen[r.DPRank] = true
	}
	return nil
}

// Validate checks an engine load.
func (l *Load) Validate() error {
	if l.Running < 0 || l.Waiting < 0 {
		return invalid("load has negative request counts")
	}
	if most := int64(MaxRequests) * MaxRanks; int64(l.Running) > most || int64(l.Waiting) > most {
		return invalid("load counts %d running and %d waiting, at most %d each", l.Running, l.Waiting, most)
	}
	if err := checkKVUsage("load.kv_usage", l.KVUsage); err != nil {
		return err
	}
	if err := checkAtMost("load.stale_seconds", l.StaleSeconds, MaxStaleSeconds, "ten years, longer than any agent runs"); err != nil {
		return err
	}
	if len(l.Ranks) > MaxRanks {
		return invalid("load has %d ranks, at most %d", len(l.Ranks), MaxRanks)
	}
	for _, r := range l.Ranks {
		if r.DPRank < 0 || r.Running < 0 || r.Waiting < 0 {
			return invalid("load rank %d has negative values", r.DPRank)
		}
		if r.Running > MaxRequests || r.Waiting > MaxRequests {
			return invalid("load rank %d counts %d running and %d waiting, at most %d each", r.DPRank, r.Running, r.Waiting, MaxRequests)
		}
		if err := checkKVUsage("load.ranks.kv_usage", r.KVUsage); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a probe result.
func (p *ProbeResult) Validate() error {
	if err := checkString("probe_result.request_id", p.RequestID); err != nil {
		return err
	}
	return p.Measurement.Validate()
}

// Validate checks a measurement: every number finite and non-negative, and
// a throughput only where the measurement claims to be valid.
func (m *Measurement) Validate() error {
	if m.CapacityKey == "" {
		return invalid("measurement.capacity_key is empty")
	}
	for name, s := range map[string]string{"measurement.capacity_key": m.CapacityKey, "measurement.node": m.Node,
		"measurement.engine_kind": m.EngineKind, "measurement.engine_url": m.EngineURL, "measurement.model": m.Model,
		"measurement.prompt": m.Prompt, "measurement.failure": m.Failure, "measurement.trigger": m.Trigger,
		"measurement.cause": m.Cause} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	for name, v := range map[string]float64{"throughput_tps": m.ThroughputTPS, "warmup_tps": m.WarmupTPS,
		"wall_seconds": m.WallSeconds, "decode_tps_p50": m.DecodeTPSP50, "decode_tps_p95": m.DecodeTPSP95,
		"ttft_seconds_p50": m.TTFTP50, "ttft_seconds_p95": m.TTFTP95, "sm_clock_min_mhz": m.SMClockMinMHz,
		"sm_clock_median_mhz": m.SMClockMedianMHz, "sm_clock_max_mhz": m.SMClockMaxMHz} {
		if err := checkNumber("measurement."+name, v); err != nil {
			return err
		}
	}
	if err := checkNumber("measurement.busy_wait_seconds", m.BusyWaitSeconds); err != nil {
		return err
	}
	if m.OutputTokens < 0 || m.ExpectedTokens < 0 || m.Requests < 0 || m.Concurrency < 0 || m.TokensPerReq < 0 ||
		m.Ranks < 0 || m.Ranks > MaxRanks || m.EngineGeneratedTokens < 0 {
		return invalid("measurement has negative counts")
	}
	if len(m.Problems) > MaxProblemCount {
		return invalid("measurement has %d problems, at most %d", len(m.Problems), MaxProblemCount)
	}
	if err := checkStrings("measurement.problems", m.Problems); err != nil {
		return err
	}
	if err := checkStrings("measurement.clock_event_reasons", m.ClockEventReasons); err != nil {
		return err
	}
	if err := checkGPUMemory("measurement.gpu_memory", m.GPUMemory); err != nil {
		return err
	}
	if m.Prefill != nil {
		if err := m.Prefill.Validate(); err != nil {
			return err
		}
	}
	return m.LoadBefore.Validate()
}

// Validate checks a measurement's prefill part like the rest: finite,
// non-negative numbers, bounded texts, and a throughput only with prompt
// tokens to show for it.
func (p *Prefill) Validate() error {
	for name, v := range map[string]float64{"prefill_tps": p.ThroughputTPS, "warmup_tps": p.WarmupTPS,
		"wall_seconds": p.WallSeconds, "ttft_seconds_p50": p.TTFTP50, "ttft_seconds_p95": p.TTFTP95} {
		if err := checkNumber("measurement.prefill."+name, v); err != nil {
			return err
		}
	}
	if p.PromptTokens < 0 || p.ExpectedPromptTokens < 0 || p.PromptLength < 0 || p.Requests < 0 ||
		p.Concurrency < 0 || p.CachedTokens < 0 {
		return invalid("measurement.prefill has negative counts")
	}
	if p.ThroughputTPS > 0 && p.PromptTokens == 0 {
		return invalid("measurement.prefill has a throughput but no prompt tokens")
	}
	for name, s := range map[string]string{"measurement.prefill.failure": p.Failure, "measurement.prefill.token_source": p.TokenSource} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	if len(p.Problems) > MaxProblemCount {
		return invalid("measurement.prefill has %d problems, at most %d", len(p.Problems), MaxProblemCount)
	}
	return checkStrings("measurement.prefill.problems", p.Problems)
}

// Validate checks a probe status.
func (p *ProbeStatus) Validate() error {
	if p.CapacityKey == "" {
		return invalid("probe_status.capacity_key is empty")
	}
	switch p.State {
	case ProbeRunning, ProbeDeferredBusy, ProbeFailed, ProbeDraining:
	default:
		return invalid("probe_status.state %q is unknown", p.State)
	}
	for name, s := range map[string]string{"probe_status.request_id": p.RequestID, "probe_status.capacity_key": p.CapacityKey, "probe_status.message": p.Message} {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a welcome.
func (w *Welcome) Validate() error {
	if w.SnapshotSeconds < 0 {
		return invalid("welcome.snapshot_seconds is negative")
	}
	if len(w.NodeCredential) > MaxCredentialBytes {
		return invalid("welcome.node_credential is %d bytes, at most %d", len(w.NodeCredential), MaxCredentialBytes)
	}
	return checkString("welcome.coordinator_version", w.CoordinatorVersion)
}

// Validate checks a probe request.
func (p *ProbeRequest) Validate() error {
	if p.CapacityKey == "" {
		return invalid("probe_request.capacity_key is empty")
	}
	switch p.Reason {
	case ReasonRegistration, ReasonScheduled, ReasonOnDemand:
	default:
		return invalid("probe_request.reason %q is unknown", p.Reason)
	}
	if err := checkString("probe_request.cause", p.Cause); err != nil {
		return err
	}
	return checkString("probe_request.request_id", p.RequestID)
}

func checkNumber(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return invalid("%s is not a finite number", name)
	}
	if v < 0 {
		return invalid("%s is negative (%g)", name, v)
	}
	return nil
}

// checkAtMost is checkNumber with an upper bound; why says what the
// bound is.
func checkAtMost(name string, v, most float64, why string) error {
	if err := checkNumber(name, v); err != nil {
		return err
	}
	if v > most {
		return invalid("%s is %g, above %g (%s)", name, v, most, why)
	}
	return nil
}

// checkKVUsage checks a fraction of a KV pool in use (MaxKVUsage).
func checkKVUsage(name string, v float64) error {
	return checkAtMost(name, v, MaxKVUsage, "a fraction of the KV pool, 0..1, not a percentage")
}

func checkString(name, s string) error {
	if len(s) > MaxStringBytes {
		return invalid("%s is %d bytes, at most %d", name, len(s), MaxStringBytes)
	}
	return nil
}

func checkName(name, s string) error {
	if strings.TrimSpace(s) == "" {
		return invalid("%s is empty", name)
	}
	if len(s) > 253 {
		return invalid("%s is longer than 253 bytes", name)
	}
	return nil
}

func checkStrings(name string, list []string) error {
	if len(list) > MaxListItems {
		return invalid("%s has %d items, at most %d", name, len(list), MaxListItems)
	}
	for _, s := range list {
		if err := checkString(name, s); err != nil {
			return err
		}
	}
	return nil
}
