// Package gpu reads per-GPU facts: through NVML on Linux (loaded without cgo),
// through powermetrics and host memory on a Mac, and nothing elsewhere.
//
// Open never leaves a caller without a Source: when GPUs cannot be read it
// returns one that reports no devices (or, on a Mac, what it can) together
// with an error, wrapping ErrUnavailable, that says why. Callers log that
// error once and carry on.
package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"heft/shared/wire"
)

// Source reports the GPUs of this host.
type Source interface {
	// Devices returns every device. A failure on one device goes in that
	// GPU's Error field and does not hide the others; the error return is
	// for failures that hide every device (count unknown, source closed,
	// ctx done).
	Devices(ctx context.Context) ([]wire.GPU, error)
	// Close releases the source. Devices fails after Close.
	Close() error
}

// ErrUnavailable is wrapped by every error that says GPU facts cannot be
// read on this host (no NVML library, no driver, no permission, ...).
var ErrUnavailable = errors.New("gpu facts unavailable")

// ErrClosed is returned by Devices after Close.
var ErrClosed = errors.New("gpu source closed")

// Names used in wire.GPU.Unsupported: the JSON names of the fields.
const (
	fieldUUID        = "uuid"
	fieldName        = "name"
	fieldMemTotal    = "memory_total_bytes"
	fieldMemFree     = "memory_free_bytes"
	fieldMemUsed     = "memory_used_bytes"
	fieldSMClock     = "sm_clock_mhz"
	fieldSMClockMax  = "sm_clock_max_mhz"
	fieldMemClock    = "mem_clock_mhz"
	fieldMemClockMax = "mem_clock_max_mhz"
	fieldReasons     = "clock_event_reasons"
	fieldTemperature = "temperature_c"
	fieldPowerDraw   = "power_draw_w"
	fieldPowerLimit  = "power_limit_w"
	fieldUtilization = "utilization_percent"
	fieldProcesses   = "processes"
)

// emptySource reports no devices; Open returns it when GPUs cannot be read.
type emptySource struct{}

func (emptySource) Devices(ctx context.Context) ([]wire.GPU, error) { return nil, ctx.Err() }
func (emptySource) Close() error                                    { return nil }

// unavailable builds the one error Open returns when GPUs cannot be read.
func unavailable(why string, cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: %s", ErrUnavailable, why)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, why, cause)
}

// Clock event reason bits, by value, as nvml.h defines them. They live here
// rather than in the cgo file so every platform can decode a mask.
var clockEventReasons = []struct {
	bit  uint64
	word string
}{
	{0x1, "gpu_idle"},
	{0x2, "applications_clocks_setting"},
	{0x4, "sw_power_cap"},
	{0x8, "hw_slowdown"},
	{0x10, "sync_boost"},
	{0x20, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"},
	{0x80, "hw_power_brake_slowdown"},
	{0x100, "display_clock_setting"},
	{0x200, "board_limit"},
	{0x400, "reliability"},
}

// DecodeClockEventReasons turns an NVML clock event (throttle) reason mask
// into words, lowest bit first. Bits NVML does not define yet come out as
// one "unknown_0x..." word holding all of them. A zero mask gives nil.
func DecodeClockEventReasons(mask uint64) []string {
	if mask == 0 {
		return nil
	}
	var words []string
	rest := mask
	for _, r := range clockEventReasons {
		if mask&r.bit != 0 {
			words = append(words, r.word)
			rest &^= r.bit
		}
	}
	if rest != 0 {
		words = append(words, fmt.Sprintf("unknown_%#x", rest))
	}
	return words
}

// joinErrors renders per-field errors for wire.GPU.Error, kept within the
// wire string limit.
func joinErrors(errs []error) string {
	parts := make([]string, len(errs))
	for i, err := range errs {
		parts[i] = err.Error()
	}
	return wire.Clip(strings.Join(parts, "; "), wire.MaxStringBytes)
}
