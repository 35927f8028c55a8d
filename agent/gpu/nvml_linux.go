//go:build linux && cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

// libraryName is the file go-nvml dlopens by default; errors name it
// because go-nvml swallows the dlopen message.
const libraryName = "libnvidia-ml.so.1"

// Symbols newer than some supported drivers. The library is opened
// RTLD_LAZY, so calling one the driver lacks aborts the whole process: look
// each up once and call it only when present.
const (
	symClocksEventReasons = "nvmlDeviceGetCurrentClocksEventReasons"
	symMemoryInfoV2       = "nvmlDeviceGetMemoryInfo_v2"
)

// Open loads NVML. Without it, the Source reports no devices and the error
// says why (no library, no driver, no permission, version mismatch).
func Open(logger hclog.Logger) (Source, error) {
	return openWith(nvml.New(), logger)
}

// openWith is Open over an injected library, so tests can drive it.
func openWith(lib nvml.Interface, logger hclog.Logger) (Source, error) {
	src, err := NewNVML(lib, logger)
	if err != nil {
		return emptySource{}, err
	}
	return src, nil
}

// NewNVML initialises lib and returns a Source over it. On failure it
// returns a nil Source and an error wrapping ErrUnavailable and the
// nvml.Return. Close shuts lib down.
func NewNVML(lib nvml.Interface, logger hclog.Logger) (Source, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, initError(ret)
	}
	ext := lib.Extensions()
	s := &nvmlSource{
		lib:       lib,
		logger:    logger.Named("nvml"),
		hasEvents: ext.LookupSymbol(symClocksEventReasons) == nil,
		hasMemV2:  ext.LookupSymbol(symMemoryInfoV2) == nil,
		procRoot:  "/proc",
	}
	if p := os.Getenv("HOST_PROC"); p != "" { // the same override gopsutil honours
		s.procRoot = p
	}
	s.logger.Debug("nvml ready", "clock_event_reasons_api", s.hasEvents, "memory_info_v2", s.hasMemV2)
	return s, nil
}

func initError(ret nvml.Return) error {
	var why string
	switch {
	case errors.Is(ret, nvml.ERROR_LIBRARY_NOT_FOUND):
		why = "cannot load the NVML library " + libraryName + " (is the NVIDIA driver installed?)"
	case errors.Is(ret, nvml.ERROR_DRIVER_NOT_LOADED):
		why = "the NVIDIA kernel driver is not loaded"
	case errors.Is(ret, nvml.ERROR_NO_PERMISSION):
		why = "no permission to open the NVIDIA devices /dev/nvidia* (does the agent's user need the video group?)"
	case errors.Is(ret, nvml.ERROR_LIB_RM_VERSION_MISMATCH):
		why = "the NVML library and the loaded NVIDIA kernel driver differ in version (reload the driver or reboot after an upgrade)"
	default:
		why = "NVML initialisation failed"
	}
	return unavailable(why, ret)
}

type nvmlSource struct {
	lib    nvml.Interface
	logger hclog.Logger
	// Cached symbol lookups, done once after Init.
	hasEvents, hasMemV2 bool
	// procRoot is where process names are read from (<root>/<pid>/comm).
	procRoot string

	mu     sync.RWMutex // held for reading by Devices, for writing by Close
	closed bool
}

func (s *nvmlSource) Devices(ctx context.Context) ([]wire.GPU, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %w", ret)
	}
	gpus := make([]wire.GPU, 0, n)
	for i := range n {
		// NVML calls cannot be interrupted; stop between devices instead.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		g := s.device(i)
		if g.Error != "" {
			s.logger.Debug("gpu partly unreadable", "index", i, "error", g.Error)
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

// device reads one GPU. Failures go in its Error field; an unsupported
// query goes in Unsupported.
func (s *nvmlSource) device(i int) wire.GPU {
	g := wire.GPU{Index: i}
	d, ret := s.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		g.Error = fmt.Sprintf("device handle: %v", ret)
		return g
	}
	r := &fieldReader{gpu: &g}
	get(r, "uuid", d.GetUUID, func(v string) { g.UUID = v }, fieldUUID)
	get(r, "name", d.GetName, func(v string) { g.Name = v }, fieldName)
	if s.hasMemV2 {
		get(r, "memory info", d.GetMemoryInfo_v2, func(m nvml.Memory_v2) {
			// v2 counts driver-reserved memory apart: Used is what
			// allocations hold, Total = Free + Used + Reserved.
			g.MemoryTotal, g.MemoryFree, g.MemoryUsed = m.Total, m.Free, m.Used
		}, fieldMemTotal, fieldMemFree, fieldMemUsed)
	} else {
		get(r, "memory info", d.GetMemoryInfo, func(m nvml.Memory) {
			g.MemoryTotal, g.MemoryFree, g.MemoryUsed = m.Total, m.Free, m.Used
		}, fieldMemTotal, fieldMemFree, fieldMemUsed)
	}
	clock := func(call func(nvml.ClockType) (uint32, nvml.Return), t nvml.ClockType) func() (uint32, nvml.Return) {
		return func() (uint32, nvml.Return) { return call(t) }
	}
	get(r, "sm clock", clock(d.GetClockInfo, nvml.CLOCK_SM), func(v uint32) { g.SMClockMHz = v }, fieldSMClock)
	get(r, "sm clock max", clock(d.GetMaxClockInfo, nvml.CLOCK_SM), func(v uint32) { g.SMClockMaxMHz = v }, fieldSMClockMax)
	get(r, "memory clock", clock(d.GetClockInfo, nvml.CLOCK_MEM), func(v uint32) { g.MemClockMHz = v }, fieldMemClock)
	get(r, "memory clock max", clock(d.GetMaxClockInfo, nvml.CLOCK_MEM), func(v uint32) { g.MemClockMaxMHz = v }, fieldMemClockMax)
	reasons := d.GetCurrentClocksThrottleReasons // drivers before NVML 12.2
	if s.hasEvents {
		reasons = d.GetCurrentClocksEventReasons
	}
	get(r, "clock event reasons", reasons, func(m uint64) { g.ClockEventReasons = DecodeClockEventReasons(m) }, fieldReasons)
	get(r, "temperature", func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) },
		func(v uint32) { g.TemperatureC = float64(v) }, fieldTemperature)
	get(r, "power draw", d.GetPowerUsage, func(mw uint32) { g.PowerDrawW = float64(mw) / 1000 }, fieldPowerDraw)
	get(r, "power limit", d.GetEnforcedPowerLimit, func(mw uint32) { g.PowerLimitW = float64(mw) / 1000 }, fieldPowerLimit)
	get(r, "utilization", d.GetUtilizationRates, func(u nvml.Utilization) { g.UtilizationPercent = float64(u.Gpu) }, fieldUtilization)
	get(r, "compute processes", d.GetComputeRunningProcesses, func(ps []nvml.ProcessInfo) { g.Processes = s.processes(ps) }, fieldProcesses)
	if len(r.errs) > 0 {
		g.Error = joinErrors(r.errs)
	}
	return g
}

// fieldReader sorts the outcome of each NVML query on one device.
type fieldReader struct {
	gpu  *wire.GPU
	errs []error
	lost bool // the GPU fell off the bus: every further call would fail too
}

// get makes one query unless the device is lost, and on success hands the
// value to set. Queries the device does not support name their fields in
// Unsupported; anything else is an error for that device.
func get[T any](r *fieldReader, what string, call func() (T, nvml.Return), set func(T), fields ...string) {
	if r.lost {
		return
	}
	v, ret := call()
	switch {
	case ret == nvml.SUCCESS:
		set(v)
	case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED), errors.Is(ret, nvml.ERROR_FUNCTION_NOT_FOUND):
		r.gpu.Unsupported = append(r.gpu.Unsupported, fields...)
	default:
		r.errs = append(r.errs, fmt.Errorf("%s: %w", what, ret))
		r.lost = errors.Is(ret, nvml.ERROR_GPU_IS_LOST)
	}
}

// processes maps NVML's list, naming each process from /proc. A process
// that has exited since keeps its pid and memory without a name.
func (s *nvmlSource) processes(ps []nvml.ProcessInfo) []wire.GPUProcess {
	if len(ps) == 0 {
		return nil
	}
	if len(ps) > wire.MaxProcesses {
		ps = ps[:wire.MaxProcesses]
	}
	out := make([]wire.GPUProcess, len(ps))
	for i, p := range ps {
		used := p.UsedGpuMemory
		if used == math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE, e.g. without privileges
			used = 0
		}
		out[i] = wire.GPUProcess{PID: int(p.Pid), Name: s.procName(int(p.Pid)), UsedMemory: used}
	}
	return out
}

func (s *nvmlSource) procName(pid int) string {
	b, err := os.ReadFile(filepath.Join(s.procRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (s *nvmlSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}
