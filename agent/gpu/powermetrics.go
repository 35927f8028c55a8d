package gpu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// PowermetricsGPU is the GPU part of one sample of
// `powermetrics --samplers gpu_power`. The Has fields say which values the
// sample carried; the others are zero.
type PowermetricsGPU struct {
	// FrequencyMHz is the GPU's average frequency while active
	// ("GPU HW active frequency"; "GPU active frequency" before macOS 13).
	FrequencyMHz float64
	// ActivePercent is the share of the interval the GPU was busy.
	ActivePercent float64
	// IdlePercent is the share of the interval the GPU was idle.
	IdlePercent float64
	// PowerW is the GPU's average power draw.
	PowerW float64

	HasFrequency, HasActive, HasIdle, HasPower bool
}

// Utilization is the busy share of the interval in percent: the active
// residency, or 100 minus the idle residency when only that was printed.
func (p PowermetricsGPU) Utilization() (float64, bool) {
	switch {
	case p.HasActive:
		return p.ActivePercent, true
	case p.HasIdle:
		return 100 - p.IdlePercent, true
	}
	return 0, false
}

// ErrNoGPUSection means the output held no GPU section at all, e.g. the
// gpu_power sampler was not asked for or is unknown to this macOS.
var ErrNoGPUSection = errors.New(`powermetrics output has no "**** GPU usage ****" section`)

const gpuSectionHeader = "**** GPU usage ****"

// maxPowermetricsLine bounds one line; real lines are well under 1 KiB.
const maxPowermetricsLine = 64 << 10

// ParsePowermetrics reads powermetrics text output and returns the GPU
// section of its last sample. Lines it does not know are skipped; a known
// line with a malformed or out-of-range value is an error.
func ParsePowermetrics(r io.Reader) (PowermetricsGPU, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxPowermetricsLine)
	var (
		p       PowermetricsGPU
		found   bool // saw a GPU section
		inGPU   bool
		lineNum int
	)
	for sc.Scan() {
		lineNum++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == gpuSectionHeader:
			// A later sample replaces an earlier one.
			p, found, inGPU = PowermetricsGPU{}, true, true
			continue
		case strings.HasPrefix(line, "***"):
			inGPU = false // another section or the next sample's banner
			continue
		case !inGPU:
			continue
		}
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var err error
		switch strings.TrimSpace(key) {
		case "GPU HW active frequency", "GPU active frequency":
			p.FrequencyMHz, err = parseQuantity(value, map[string]float64{"MHz": 1, "GHz": 1000})
			p.HasFrequency = err == nil
		case "GPU HW active residency", "GPU active residency":
			p.ActivePercent, err = parsePercent(value)
			p.HasActive = err == nil
		case "GPU idle residency":
			p.IdlePercent, err = parsePercent(value)
			p.HasIdle = err == nil
		case "GPU Power":
			p.PowerW, err = parseQuantity(value, map[string]float64{"mW": 0.001, "W": 1})
			p.HasPower = err == nil
		}
		if err != nil {
			return PowermetricsGPU{}, fmt.Errorf("powermetrics line %d %q: %w", lineNum, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return PowermetricsGPU{}, fmt.Errorf("read powermetrics output: %w", err)
	}
	if !found {
		return PowermetricsGPU{}, ErrNoGPUSection
	}
	if !p.HasFrequency && !p.HasActive && !p.HasIdle && !p.HasPower {
		return PowermetricsGPU{}, errors.New("powermetrics GPU section has no frequency, residency or power line")
	}
	return p, nil
}

// parseQuantity reads "<number> <unit>" (the space optional) and scales
// the number by the unit's factor.
func parseQuantity(s string, units map[string]float64) (float64, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return 0, errors.New("no value")
	}
	num, unit := fields[0], ""
	if len(fields) > 1 {
		unit = fields[1]
	} else if i := strings.IndexFunc(num, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }); i > 0 {
		num, unit = num[:i], num[i:]
	}
	factor, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q", unit)
	}
	v, err := parseNonNegative(num)
	if err != nil {
		return 0, err
	}
	return v * factor, nil
}

// parsePercent reads the first field of a residency value, "45.23%"
// (a per-frequency breakdown may follow in parentheses).
func parsePercent(s string) (float64, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 || !strings.HasSuffix(fields[0], "%") {
		return 0, errors.New("no percentage")
	}
	v, err := parseNonNegative(strings.TrimSuffix(fields[0], "%"))
	if err != nil {
		return 0, err
	}
	if v > 100 {
		return 0, fmt.Errorf("percentage %g is above 100", v)
	}
	return v, nil
}

func parseNonNegative(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%q is not a finite non-negative number", s)
	}
	return v, nil
}
