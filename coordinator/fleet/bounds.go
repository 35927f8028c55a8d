package fleet

import (
	"fmt"

	"heft/shared/wire"
)

// What one stored measurement may hold. The wire allows a 1 MiB message;
// the fleet keeps a measurement for every capacity key, with a history,
// for hours, so it keeps far less of what is only there to explain.
const (
	keptProblems     = 16
	keptProblemBytes = 512
	keptReasons      = 16
	keptReasonBytes  = 64
	keptTextBytes    = 512 // prompt, URL, model, key and other texts
	keptLoadRanks    = 64
	// keptUUIDBytes bounds a GPU UUID a measurement names ("GPU-" and 36
	// characters from NVML): a longer one names no GPU and is dropped.
	keptUUIDBytes = 64
)

// cutMeasurement cuts a measurement's texts and lists to what the fleet
// keeps, in place, and reports whether it cut anything.
func cutMeasurement(m *wire.Measurement) bool {
	cut := false
	clip := func(s *string, n int) {
		if len(*s) > n {
			*s, cut = wire.Clip(*s, n), true
		}
	}
	for _, s := range []*string{&m.Node, &m.EngineKind, &m.EngineURL, &m.Model, &m.Prompt, &m.Failure, &m.Trigger, &m.Cause, &m.Implausible} {
		clip(s, keptTextBytes)
	}
	if gm := cutGPUMemory(m.GPUMemory); len(gm) != len(m.GPUMemory) {
		m.GPUMemory, cut = gm, true
	}
	if len(m.Problems) > keptProblems {
		n := len(m.Problems) - keptProblems + 1
		m.Problems = append(m.Problems[:keptProblems-1:keptProblems-1], fmt.Sprintf("(%d more problems not kept)", n))
		cut = true
	}
	for i := range m.Problems {
		clip(&m.Problems[i], keptProblemBytes)
	}
	if len(m.ClockEventReasons) > keptReasons {
		m.ClockEventReasons, cut = m.ClockEventReasons[:keptReasons:keptReasons], true
	}
	for i := range m.ClockEventReasons {
		clip(&m.ClockEventReasons[i], keptReasonBytes)
	}
	if len(m.LoadBefore.Ranks) > keptLoadRanks {
		m.LoadBefore.Ranks, cut = m.LoadBefore.Ranks[:keptLoadRanks:keptLoadRanks], true
	}
	if p := m.Prefill; p != nil {
		clip(&p.Failure, keptTextBytes)
		clip(&p.TokenSource, keptTextBytes)
		if len(p.Problems) > keptProblems {
			n := len(p.Problems) - keptProblems + 1
			p.Problems = append(p.Problems[:keptProblems-1:keptProblems-1], fmt.Sprintf("(%d more problems not kept)", n))
			cut = true
		}
		for i := range p.Problems {
			clip(&p.Problems[i], keptProblemBytes)
		}
	}
	return cut
}

// cutGPUMemory keeps at most MaxGPUs of a burst's GPUs, those whose UUID
// could be a GPU's: up to 256 of 4 KiB each pass the wire, and were kept
// in every history entry.
func cutGPUMemory(list []wire.GPUMemory) []wire.GPUMemory {
	out := list[:0:0]
	for _, g := range list {
		if len(g.UUID) <= keptUUIDBytes && len(out) < wire.MaxGPUs {
			out = append(out, g)
		}
	}
	return out
}

// HistoryEntry is what a capacity key's history keeps of a measurement:
// its numbers and verdict, without the texts and load that explain the
// latest one. The store writes history entries through it too.
func HistoryEntry(m wire.Measurement) wire.Measurement {
	m.Problems, m.ClockEventReasons, m.Prompt, m.LoadBefore = nil, nil, "", wire.Load{}
	m.Implausible = wire.Clip(m.Implausible, keptProblemBytes)
	if m.Prefill != nil {
		p := *m.Prefill
		p.Problems = nil
		m.Prefill = &p
	}
	return m
}
