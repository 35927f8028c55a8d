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
