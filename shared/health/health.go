// Package health turns facts about an engine, its GPUs and its last
// measurement into warnings an operator can act on. The agent's inspect
// command and the coordinator use the same rules and the same words.
package health

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"heft/shared/address"
	"heft/shared/wire"
)

// Thresholds are the configurable limits behind the warnings.
type Thresholds struct {
	// PoolHold: smallest/largest DP pool below this holds the worker.
	PoolHold float64 `toml:"pool_hold"`
	// PoolWarn: below this (but above PoolHold) warns.
	PoolWarn float64 `toml:"pool_warn"`
	// ClockLow: median SM clock during the measured burst below this
	// fraction of its maximum warns.
	ClockLow float64 `toml:"clock_low"`
	// ForeignMinBytes: foreign processes holding less are ignored.
	ForeignMinBytes uint64 `toml:"foreign_min_bytes"`
}

// DefaultThresholds are the limits PRODUCT.md and the issues name.
func DefaultThresholds() Thresholds {
	return Thresholds{PoolHold: 0.5, PoolWarn: 0.9, ClockLow: 0.8, ForeignMinBytes: 256 << 20}
}

// Finding is one warning before it gets a time stamp.
type Finding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// Sort orders findings most severe first, then by code.
func Sort(fs []Finding) {
	if len(fs) < 2 {
		return // the usual case, and the coordinator sorts every worker's on each reweigh
	}
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(wire.SeverityRank(a.Severity), wire.SeverityRank(b.Severity)), strings.Compare(a.Code, b.Code))
	})
}

// ForeignProcesses warns about memory held on the engine's GPUs by
// processes outside the engine's process tree.
func ForeignProcesses(e wire.Engine, gpus []wire.GPU, th Thresholds) *Finding {
	var parts []string
	for _, g := range gpus {
		if len(e.GPUUUIDs) > 0 && !slices.Contains(e.GPUUUIDs, g.UUID) {
			continue
		}
		for _, p := range g.Processes {
			if !p.Foreign || p.UsedMemory < th.ForeignMinBytes {
				continue
			}
			name := p.Name
			if name == "" {
				name = "?"
			}
			parts = append(parts, fmt.Sprintf("pid %d (%s) holds %s on GPU %d", p.PID, name, gib(p.UsedMemory), g.Index))
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return &Finding{Code: wire.CodeForeignGPUProcess, Severity: wire.SeverityWarning, Message: "processes outside the engine hold memory on its GPUs: " +
		strings.Join(parts, "; ") + ". They shrink the KV pool at the engine's next start and compete for the GPU."}
}

// Clocks warns when the SM clock during the measured burst ran well under
// its maximum, or when the GPU reported a slowdown reason (wire.Slowdowns).
func Clocks(m wire.Measurement, th Thresholds) []Finding {
	var out []Finding
	if m.SMClockMaxMHz > 0 && m.SMClockMedianMHz > 0 && m.SMClockMedianMHz < th.ClockLow*m.SMClockMaxMHz {
		msg := fmt.Sprintf("SM clock during the measured burst: median %.0f MHz, minimum %.0f MHz, against a maximum of %.0f MHz (%.0f%%)",
			m.SMClockMedianMHz, m.SMClockMinMHz, m.SMClockMaxMHz, 100*m.SMClockMedianMHz/m.SMClockMaxMHz)
		if len(m.ClockEventReasons) > 0 {
			msg += "; reasons: " + strings.Join(m.ClockEventReasons, ", ")
		}
		out = append(out, Finding{Code: wire.CodeGPUClockLow, Severity: wire.SeverityWarning, Message: msg + ". The measured throughput is what this GPU gives while held back; check cooling, power limits and application clocks."})
	}
	// A power cap is how a GPU under load runs (an H200 beside a busy
	// neighbour read 74 % of its clock at 690 of 700 W with nothing else
	// reported): it is named in the low-clock finding, never a throttle.
	if r := wire.Slowdowns(m.ClockEventReasons); len(r) > 0 {
		out = append(out, Finding{Code: wire.CodeGPUThrottled, Severity: wire.SeverityWarning, Message: "the GPU was throttled during the measured burst: " +
			strings.Join(r, ", ") + "."})
	}
	return out
}

// Measurement turns a probe's outcome into findings.
func Measurement(m wire.Measurement, th Thresholds) []Finding {
	var out []Finding
	switch {
	case m.Failure == wire.CodeProbeIncompleteOutput:
		out = append(out, Finding{Code: wire.CodeProbeIncompleteOutput, Severity: wire.SeverityCritical, Message: "the engine returned " +
			fmt.Sprintf("%d of %d tokens asked for", m.OutputTokens, m.ExpectedTokens) + problems(m) +
			"; the measurement was not used."})
	case m.Failure != "":
		out = append(out, Finding{Code: wire.CodeProbeFailed, Severity: wire.SeverityCritical, Message: "the probe failed" + problems(m) + "."})
	case !m.Complete:
		out = append(out, Finding{Code: wire.CodeProbeIncompleteOutput, Severity: wire.SeverityWarning, Message: fmt.Sprintf(
			"this engine cannot be told to produce an exact length: %d of %d tokens came back, and throughput is counted from the tokens received", m.OutputTokens, m.ExpectedTokens) + problems(m) + "."})
	}
	if m.Failure == "" {
		out = append(out, Clocks(m, th)...)
	}
	if f := Prefill(m); f != nil {
		out = append(out, *f)
	}
	return out
}

// Prefill warns when a probe's prefill burst gave no prefill throughput
// while its decode burst did: the worker keeps its decode weight and has
// no prefill weight.
func Prefill(m wire.Measurement) *Finding {
	p := m.Prefill
	if p == nil || p.Failure == "" || m.Failure != "" {
		return nil
	}
	what := map[string]string{
		wire.PrefillRejected:           "the engine refused the long prompts",
		wire.PrefillTruncated:          "the engine cut the long prompts short",
		wire.PrefillUsageMismatch:      "the engine's usage counts more prompt tokens than were sent",
		wire.PrefillCached:             "the long prompts came back as if read from a cache",
		wire.CodeProbeIncompleteOutput: "the engine does not say how many prompt tokens it read",
	}[p.Failure]
	if what == "" {
		what = "the prefill requests failed"
	}
	parts := make([]string, 0, 3)
	for i, x := range p.Problems {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(p.Problems)-3))
			break
		}
		parts = append(parts, wire.Clip(x, 300))
	}
	msg := fmt.Sprintf("the prefill burst gave no prefill weight: %s (%s). The decode measurement stands; the worker has no prefill weight until a probe reads its prompts as sent.",
		what, strings.Join(parts, "; "))
	return &Finding{Code: wire.CodePrefillFailed, Severity: wire.SeverityWarning, Message: msg}
}

// ContextExceedsPool warns when the engine accepts longer sequences than
// its smallest data-parallel rank's KV pool holds: a long request dealt
// to that rank cannot run, so what the worker really holds
// (max_context_tokens) is the pool.
func ContextExceedsPool(e wire.Engine) *Finding {
	if e.MaxModelLen <= 0 || len(e.Ranks) == 0 {
		return nil
	}
	small := e.Ranks[0]
	for _, r := range e.Ranks[1:] {
		if r.KVTokens < small.KVTokens {
			small = r
		}
	}
	if small.KVTokens <= 0 || small.KVTokens >= e.MaxModelLen {
		return nil
	}
	where := "its KV pool"
	if len(e.Ranks) > 1 {
		where = fmt.Sprintf("its smallest data-parallel rank's KV pool (rank %d)", small.DPRank)
	}
	msg := fmt.Sprintf("the engine accepts sequences of up to %s tokens (max model length) but %s holds only %s tokens: "+
		"a longer request cannot run there, and requests are dealt to ranks in turn. What the worker really holds (max_context_tokens) is %s tokens; "+
		"gateways should send longer prompts to workers that hold them. Fix: set the max model length to what the pool holds "+
		"(vLLM --max-model-len, SGLang --context-length), or give the rank more KV memory.",
		Thousands(e.MaxModelLen), where, Thousands(small.KVTokens), Thousands(small.KVTokens))
	return &Finding{Code: wire.CodeContextExceedsPool, Severity: wire.SeverityWarning, Message: msg}
}

// Engine turns an engine's current facts into findings.
func Engine(e wire.Engine, gpus []wire.GPU, th Thresholds) []Finding {
	var out []Finding
	if e.Error != "" {
		out = append(out, Finding{Code: wire.CodeEngineUnreachable, Severity: wire.SeverityCritical, Message: "the engine at " + e.URL + " cannot be read: " + e.Error})
	}
	out = append(out, PoolFindings(e, th)...)
	if f := ContextExceedsPool(e); f != nil {
		out = append(out, *f)
	}
	if f := ForeignProcesses(e, gpus, th); f != nil {
		out = append(out, *f)
	}
	if f := Routable(e); f != nil {
		out = append(out, *f)
	}
	return out
}

// Routable warns when a gateway on another node could not reach the
// engine: the URL offered to gateways (its advertise URL, else the URL
// the agent dials) names this node's loopback. A gateway on the same node
// still can, so the worker is not held; a loopback advertise_url set in
// the config is a choice, so it is only info.
func Routable(e wire.Engine) *Finding {
	const fix = "Set advertise_url in its [[engine]] table to an address gateways reach"
	if e.AdvertiseURL != "" {
		if !address.IsLoopback(urlHost(e.AdvertiseURL)) {
			return nil
		}
		// Configured on purpose (a gateway on the same node, as in a
		// one-host fleet): said, but only as info.
		return &Finding{Code: wire.CodeNotRoutable, Severity: wire.SeverityInfo, Message: "the engine is advertised to gateways at " +
			e.AdvertiseURL + ", a loopback address: only a gateway on this node can reach it. " + fix + " if gateways run elsewhere."}
	}
	host := urlHost(e.URL)
	if !address.IsLoopback(host) && !isUnspecified(host) {
		return nil
	}
	msg := "gateways are given the engine URL " + e.URL + ", a loopback address, "
	if len(e.Listen) > 0 {
		msg += "because the engine listens on " + strings.Join(e.Listen, ", ") + " only: a gateway on another node cannot reach it. " +
			"Start the engine on 0.0.0.0 (the agent then offers this node's address) or on this node's address, or " + strings.ToLower(fix[:1]) + fix[1:] + "."
	} else {
		msg += "and the agent could not see where the engine listens: only a gateway on this node can reach it. " + fix + "."
	}
	return &Finding{Code: wire.CodeNotRoutable, Severity: wire.SeverityWarning, Message: msg}
}

func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

func isUnspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// problems quotes the first few of a measurement's problems, each cut
// short: a warning is read by a person and shown on every dashboard.
func problems(m wire.Measurement) string {
	const most, longest = 3, 300
	if len(m.Problems) == 0 {
		return ""
	}
	var parts []string
	for i, p := range m.Problems {
		if i == most {
			parts = append(parts, fmt.Sprintf("and %d more", len(m.Problems)-most))
			break
		}
		parts = append(parts, wire.Clip(p, longest))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func gib(b uint64) string {
	return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
}

// Thousands formats 24094 as "24,094", as warnings print pool sizes.
func Thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
