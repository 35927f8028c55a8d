package wire

import "unicode/utf8"

// Warning codes: what a worker's warnings, a failed measurement's Failure
// and the API's "code" fields carry. Both binaries and the dashboard use
// these strings; they are part of the public API.
const (
	CodeDPPoolImbalance        = "dp_pool_imbalance"
	CodeGPUClockLow            = "gpu_clock_low"
	CodeGPUThrottled           = "gpu_throttled"
	CodeForeignGPUProcess      = "foreign_gpu_process"
	CodeProbeIncompleteOutput  = "probe_incomplete_output"
	CodeProbeFailed            = "probe_failed"
	CodeEngineUnreachable      = "engine_unreachable"
	CodeAgentOffline           = "agent_offline"
	CodeWeightClamped          = "weight_clamped"
	CodePoolsIncomplete        = "pools_incomplete"
	CodePoolsUnknown           = "pools_unknown"
	CodePoolsDisagree          = "pools_disagree"
	CodeNotRoutable            = "not_routable"
	CodeContextExceedsPool     = "context_exceeds_pool"
	CodeImplausibleMeasurement = "implausible_measurement"
	// CodePrefillFailed: the probe's prefill burst gave no prefill
	// throughput (Prefill.Failure says how); the decode part may be fine.
	CodePrefillFailed = "prefill_failed"
	// CodeAddressNotAllowed: the address the engine is offered to gateways
	// at is not its node's (the coordinator's advertise_allow says which
	// are); the worker is held.
	CodeAddressNotAllowed = "address_not_allowed"
	// CodeProbation: a worker whose weight is not yet earned (no admin
	// admitted it, and its measurements have not yet agreed over the
	// probation period): its weight is at most 1 and it does not count in
	// its model's median (info).
	CodeProbation = "probation"
	// CodeNodeShareCapped: the weights of a node's workers were scaled down
	// so that one node holds at most plausibility.max_node_share of its
	// model's weight (warning).
	CodeNodeShareCapped = "node_share_capped"
	// CodeNodeCapacityCapped: a node's workers together measured more than
	// its distinct GPUs deliver at plausibility.max_tps_per_gpu each; each
	// is weighed at its share of that bound (warning).
	CodeNodeCapacityCapped = "node_capacity_capped"
	// CodeProbeDeferred: the worker's last probe requests found its engine
	// busy (deferred_busy: it never went idle, or the burst was shared
	// with other traffic and discarded); the coordinator waits longer
	// before each next request. A warning while the worker has no valid
	// measurement, info for a measured one.
	CodeProbeDeferred = "probe_deferred"
)

// Why a probe's prefill part failed (Prefill.Failure), besides
// CodeProbeFailed and CodeProbeIncompleteOutput.
const (
	// PrefillRejected: the engine refused the long prompts (its context is
	// smaller than it says, or a limit of its own).
	PrefillRejected = "prefill_rejected"
	// PrefillTruncated: usage counts fewer prompt tokens than were sent.
	PrefillTruncated = "prefill_truncated"
	// PrefillUsageMismatch: usage counts more prompt tokens than were sent.
	PrefillUsageMismatch = "prefill_usage_mismatch"
	// PrefillCached: prompts with a unique random prefix came back as if
	// read from a cache (the engine said so, or the first token came as
	// fast as a short prompt's).
	PrefillCached = "prefill_cached"
)

// Severities, most severe first.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// SeverityRank orders severities: lower is more severe.
func SeverityRank(s string) int {
	switch s {
	case SeverityCritical:
		return 0
	case SeverityWarning:
		return 1
	default:
		return 2
	}
}

// Clip shortens s to at most max bytes without splitting a UTF-8 rune,
// ending a shortened string with "…" (counted in max). Every text that
// crosses a process boundary (errors, engine answers, log lines) is
// clipped with it, so none grows without bound.
func Clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const ellipsis = "…"
	if max < len(ellipsis) {
		return ""
	}
	cut := max - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// SlowdownReasons are the GPU clock event reasons (the agent's words for
// NVML's) that mean the GPU runs slower than it can under load. A power
// cap is not one: a GPU under load runs at its power limit.
var SlowdownReasons = []string{"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}

// Slowdowns returns the slowdown reasons among reasons, in their order.
func Slowdowns(reasons []string) []string {
	var out []string
	for _, r := range reasons {
		for _, s := range SlowdownReasons {
			if r == s {
				out = append(out, r)
			}
		}
	}
	return out
}
