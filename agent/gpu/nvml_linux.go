//go:build linux

package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"heft/shared/wire"
)

// libraryName is the file the NVIDIA driver installs and the container
// runtime mounts; it is found the way the dynamic linker finds libraries.
const libraryName = "libnvidia-ml.so.1"

// Symbols newer than some supported drivers: looked up once, and the older
// call is made when they are missing.
const (
	symClocksEventReasons = "nvmlDeviceGetCurrentClocksEventReasons"
	symMemoryInfoV2       = "nvmlDeviceGetMemoryInfo_v2"
)

// Open loads NVML. Without it, the Source reports no devices and the error
// says why (no library, no driver, no permission, version mismatch).
func Open(logger hclog.Logger) (Source, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return openLibrary(libraryName, logger.Named("gpu"))
}

// openLibrary is Open with the library's path, so tests can load another.
func openLibrary(path string, logger hclog.Logger) (Source, error) {
	lib, err := loadNVML(path)
	if err != nil {
		return emptySource{}, unavailable("cannot load the NVML library "+path+" (is the NVIDIA driver installed?)", err)
	}
	return openWith(lib, logger)
}

// openWith is Open over an already loaded library.
func openWith(lib nvmlLibrary, logger hclog.Logger) (Source, error) {
	src, err := newNVMLSource(lib, logger)
	if err != nil {
		return emptySource{}, err
	}
	return src, nil
}

// newNVMLSource initialises lib and returns a Source over it. On failure it
// returns nil and an error wrapping ErrUnavailable and the nvmlReturn.
// Close shuts lib down.
func newNVMLSource(lib nvmlLibrary, logger hclog.Logger) (*nvmlSource, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if ret := lib.Init(); ret != nvmlSuccess {
		return nil, initError(ret)
	}
	s := &nvmlSource{
		lib:       lib,
		logger:    logger.Named("nvml"),
		hasEvents: lib.HasSymbol(symClocksEventReasons),
		hasMemV2:  lib.HasSymbol(symMemoryInfoV2),
		procRoot:  "/proc",
	}
	if p := os.Getenv("HOST_PROC"); p != "" { // the same override gopsutil honours
		s.procRoot = p
	}
	s.logger.Debug("nvml ready", "clock_event_reasons_api", s.hasEvents, "memory_info_v2", s.hasMemV2)
	return s, nil
}

func initError(ret nvmlReturn) error {
	var why string
	switch ret {
	case errLibraryNotFound:
		why = "cannot load the NVML library " + libraryName + " (is the NVIDIA driver installed?)"
	case errDriverNotLoaded:
		why = "the NVIDIA kernel driver is not loaded"
	case errNoPermission:
		why = "no permission to open the NVIDIA devices /dev/nvidia* (does the agent's user need the video group?)"
	case errLibRMVersionMismatch:
		why = "the NVML library and the loaded NVIDIA kernel driver differ in version (reload the driver or reboot after an upgrade)"
	default:
		why = "NVML initialisation failed"
	}
	return unavailable(why, ret)
}

type nvmlSource struct {
	lib    nvmlLibrary
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
	n, ret := s.lib.DeviceCount()
	if ret != nvmlSuccess {
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
	d, ret := s.lib.DeviceByIndex(i)
	if ret != nvmlSuccess {
		g.Error = fmt.Sprintf("device handle: %v", ret)
		return g
	}
	r := &fieldReader{gpu: &g}
	get(r, "uuid", d.UUID, func(v string) { g.UUID = v }, fieldUUID)
	get(r, "name", d.Name, func(v string) { g.Name = v }, fieldName)
	// v2 counts driver-reserved memory apart: Used is what allocations
	// hold, Total = Free + Used + Reserved. v1's Used includes the reserve.
	memory := d.MemoryInfo
	if s.hasMemV2 {
		memory = d.MemoryInfoV2
	}
	get(r, "memory info", memory, func(m nvmlMemory) {
		g.MemoryTotal, g.MemoryFree, g.MemoryUsed = m.Total, m.Free, m.Used
	}, fieldMemTotal, fieldMemFree, fieldMemUsed)
	clock := func(call func(nvmlClock) (uint32, nvmlReturn), c nvmlClock) func() (uint32, nvmlReturn) {
		return func() (uint32, nvmlReturn) { return call(c) }
	}
	get(r, "sm clock", clock(d.ClockInfo, clockSM), func(v uint32) { g.SMClockMHz = v }, fieldSMClock)
	get(r, "sm clock max", clock(d.MaxClockInfo, clockSM), func(v uint32) { g.SMClockMaxMHz = v }, fieldSMClockMax)
	get(r, "memory clock", clock(d.ClockInfo, clockMem), func(v uint32) { g.MemClockMHz = v }, fieldMemClock)
	get(r, "memory clock max", clock(d.MaxClockInfo, clockMem), func(v uint32) { g.MemClockMaxMHz = v }, fieldMemClockMax)
	reasons := d.ClocksThrottleReasons // drivers before NVML 12.2
	if s.hasEvents {
		reasons = d.ClocksEventReasons
	}
	get(r, "clock event reasons", reasons, func(m uint64) { g.ClockEventReasons = DecodeClockEventReasons(m) }, fieldReasons)
	get(r, "temperature", d.Temperature, func(v uint32) { g.TemperatureC = float64(v) }, fieldTemperature)
	get(r, "power draw", d.PowerUsage, func(mw uint32) { g.PowerDrawW = float64(mw) / 1000 }, fieldPowerDraw)
	get(r, "power limit", d.EnforcedPowerLimit, func(mw uint32) { g.PowerLimitW = float64(mw) / 1000 }, fieldPowerLimit)
	get(r, "utilization", d.Utilization, func(u nvmlUtilization) { g.UtilizationPercent = float64(u.GPU) }, fieldUtilization)
	get(r, "compute processes", d.ComputeProcesses, func(ps []nvmlProcess) { g.Processes = s.processes(ps) }, fieldProcesses)
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
func get[T any](r *fieldReader, what string, call func() (T, nvmlReturn), set func(T), fields ...string) {
	if r.lost {
		return
	}
	v, ret := call()
	switch {
	case ret == nvmlSuccess:
		set(v)
	case ret == errNotSupported, ret == errFunctionNotFound:
		r.gpu.Unsupported = append(r.gpu.Unsupported, fields...)
	default:
		r.errs = append(r.errs, fmt.Errorf("%s: %w", what, ret))
		r.lost = ret == errGPUIsLost
	}
}

// processes maps NVML's list, naming each process from /proc. A process
// that has exited since keeps its pid and memory without a name.
func (s *nvmlSource) processes(ps []nvmlProcess) []wire.GPUProcess {
	if len(ps) == 0 {
		return nil
	}
	if len(ps) > wire.MaxProcesses {
		ps = ps[:wire.MaxProcesses]
	}
	out := make([]wire.GPUProcess, len(ps))
	for i, p := range ps {
		used := p.UsedMemory
		if used == nvmlValueNotAvailable { // e.g. without privileges
			used = 0
		}
		out[i] = wire.GPUProcess{PID: int(p.PID), Name: s.procName(int(p.PID)), UsedMemory: used}
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
	if ret := s.lib.Shutdown(); ret != nvmlSuccess {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}
