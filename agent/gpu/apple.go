package gpu

import (
	"fmt"
	"math"
	"strings"

	"heft/shared/wire"
)

// appleGPU describes the integrated GPU of an Apple silicon Mac. Memory is
// the host's unified memory. pm is nil when powermetrics was not run (the
// agent is not root); pmErr says why a run gave nothing. Whatever is not
// known is named in Unsupported.
//
// It lives outside the darwin file so it is tested on every platform.
func appleGPU(h wire.Host, pm *PowermetricsGPU, pmErr error) wire.GPU {
	model := strings.TrimSpace(h.CPUModel)
	if model == "" {
		model = "Apple GPU"
	}
	g := wire.GPU{
		Name: model + " (integrated)",
		// NVML-only facts; Apple exposes no per-GPU identity, clock
		// limits, temperature or process list to an agent.
		Unsupported: []string{fieldUUID, fieldSMClockMax, fieldMemClock, fieldMemClockMax,
			fieldReasons, fieldTemperature, fieldPowerLimit, fieldProcesses},
	}
	if h.MemoryTotal > 0 {
		g.MemoryTotal = h.MemoryTotal
		g.MemoryFree = min(h.MemoryAvailable, h.MemoryTotal)
		g.MemoryUsed = h.MemoryTotal - g.MemoryFree
	} else {
		g.Unsupported = append(g.Unsupported, fieldMemTotal, fieldMemFree, fieldMemUsed)
	}

	var p PowermetricsGPU
	if pm != nil {
		p = *pm
	}
	if p.HasFrequency && p.FrequencyMHz <= math.MaxUint32 {
		g.SMClockMHz = uint32(math.Round(p.FrequencyMHz))
	} else {
		g.Unsupported = append(g.Unsupported, fieldSMClock)
	}
	if u, ok := p.Utilization(); ok {
		g.UtilizationPercent = u
	} else {
		g.Unsupported = append(g.Unsupported, fieldUtilization)
	}
	if p.HasPower {
		g.PowerDrawW = p.PowerW
	} else {
		g.Unsupported = append(g.Unsupported, fieldPowerDraw)
	}
	if pmErr != nil {
		g.Error = joinErrors([]error{fmt.Errorf("powermetrics: %w", pmErr)})
	}
	return g
}
