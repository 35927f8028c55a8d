//go:build linux

package gpu

import (
	"bytes"
	"fmt"
	"math"
	"structs"

	"github.com/ebitengine/purego"
)

// NVML is loaded with purego's dlopen rather than through cgo, so the agent
// builds with CGO_ENABLED=0: the binary then asks for no versioned glibc
// symbol and runs on any glibc distribution the NVIDIA driver supports (see
// packaging/elfcheck). Only the calls the Source makes are bound.
//
// The C structs below mirror nvml.h on LP64 (amd64, arm64); the layout test
// compiles them against the real header.

// cMemory is nvmlMemory_t.
type cMemory struct {
	_                 structs.HostLayout
	Total, Free, Used uint64
}

// cMemoryV2 is nvmlMemory_v2_t. Version must be cMemoryV2Version.
type cMemoryV2 struct {
	_                           structs.HostLayout
	Version                     uint32
	Total, Reserved, Free, Used uint64
}

// cMemoryV2Version is nvml.h's nvmlMemory_v2: NVML_STRUCT_VERSION(Memory, 2),
// the struct's size with the version in the top byte.
const cMemoryV2Version = 40 | 2<<24

// cUtilization is nvmlUtilization_t.
type cUtilization struct {
	_           structs.HostLayout
	GPU, Memory uint32
}

// cProcessInfoV1 is nvmlProcessInfo_v1_t, filled by
// nvmlDeviceGetComputeRunningProcesses (drivers before 11.x).
type cProcessInfoV1 struct {
	_             structs.HostLayout
	PID           uint32
	UsedGPUMemory uint64
}

// cProcessInfoV2 is nvmlProcessInfo_v2_t (= nvmlProcessInfo_t), filled by
// the _v2 and _v3 calls.
type cProcessInfoV2 struct {
	_                                structs.HostLayout
	PID                              uint32
	UsedGPUMemory                    uint64
	GPUInstanceID, ComputeInstanceID uint32
}

// Buffer sizes nvml.h guarantees to be enough (the _V2_ sizes).
const (
	uuidBufferSize = 96 // NVML_DEVICE_UUID_V2_BUFFER_SIZE
	nameBufferSize = 96 // NVML_DEVICE_NAME_V2_BUFFER_SIZE
)

// nvmlLib is libnvidia-ml bound through purego. A function the library
// does not export stays nil and its method returns errFunctionNotFound.
type nvmlLib struct {
	handle uintptr

	init        func() nvmlReturn
	shutdown    func() nvmlReturn
	count       func(n *uint32) nvmlReturn
	byIndex     func(i uint32, dev *uintptr) nvmlReturn
	uuid        func(dev uintptr, buf *byte, size uint32) nvmlReturn
	name        func(dev uintptr, buf *byte, size uint32) nvmlReturn
	memory      func(dev uintptr, m *cMemory) nvmlReturn
	memoryV2    func(dev uintptr, m *cMemoryV2) nvmlReturn
	clock       func(dev uintptr, clock nvmlClock, mhz *uint32) nvmlReturn
	maxClock    func(dev uintptr, clock nvmlClock, mhz *uint32) nvmlReturn
	events      func(dev uintptr, mask *uint64) nvmlReturn
	throttle    func(dev uintptr, mask *uint64) nvmlReturn
	temperature func(dev uintptr, sensor uint32, c *uint32) nvmlReturn
	power       func(dev uintptr, mw *uint32) nvmlReturn
	powerLimit  func(dev uintptr, mw *uint32) nvmlReturn
	utilization func(dev uintptr, u *cUtilization) nvmlReturn
	processesV2 func(dev uintptr, n *uint32, infos *cProcessInfoV2) nvmlReturn
	processesV1 func(dev uintptr, n *uint32, infos *cProcessInfoV1) nvmlReturn
}

// loadNVML opens the library at path (a file name is searched for the way
// the dynamic linker does) and binds its functions. The error wraps
// errLibraryNotFound and carries dlopen's own message; a library without
// the four calls every NVML has is refused the same way.
//
// The library is never closed: the agent loads it once for its lifetime, and
// unloading it would only risk a call into unmapped code.
func loadNVML(path string) (*nvmlLib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errLibraryNotFound, err)
	}
	l := &nvmlLib{handle: h}
	// The first name found wins: the current ABI before the older one.
	required := []struct {
		fn    any
		names []string
	}{
		{&l.init, []string{"nvmlInit_v2", "nvmlInit"}},
		{&l.shutdown, []string{"nvmlShutdown"}},
		{&l.count, []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}},
		{&l.byIndex, []string{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}},
	}
	for _, r := range required {
		if !l.bind(r.fn, r.names...) {
			return nil, fmt.Errorf("%w: %s exports none of %q: not an NVML library", errLibraryNotFound, path, r.names)
		}
	}
	l.bind(&l.uuid, "nvmlDeviceGetUUID")
	l.bind(&l.name, "nvmlDeviceGetName")
	l.bind(&l.memory, "nvmlDeviceGetMemoryInfo")
	l.bind(&l.memoryV2, symMemoryInfoV2)
	l.bind(&l.clock, "nvmlDeviceGetClockInfo")
	l.bind(&l.maxClock, "nvmlDeviceGetMaxClockInfo")
	l.bind(&l.events, symClocksEventReasons)
	l.bind(&l.throttle, "nvmlDeviceGetCurrentClocksThrottleReasons")
	l.bind(&l.temperature, "nvmlDeviceGetTemperature")
	l.bind(&l.power, "nvmlDeviceGetPowerUsage")
	l.bind(&l.powerLimit, "nvmlDeviceGetEnforcedPowerLimit")
	l.bind(&l.utilization, "nvmlDeviceGetUtilizationRates")
	l.bind(&l.processesV2, "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
	l.bind(&l.processesV1, "nvmlDeviceGetComputeRunningProcesses")
	return l, nil
}

// bind points fn at the first of names the library exports.
func (l *nvmlLib) bind(fn any, names ...string) bool {
	for _, name := range names {
		if sym, err := purego.Dlsym(l.handle, name); err == nil && sym != 0 {
			purego.RegisterFunc(fn, sym)
			return true
		}
	}
	return false
}

func (l *nvmlLib) Init() nvmlReturn     { return l.init() }
func (l *nvmlLib) Shutdown() nvmlReturn { return l.shutdown() }

func (l *nvmlLib) HasSymbol(name string) bool {
	sym, err := purego.Dlsym(l.handle, name)
	return err == nil && sym != 0
}

func (l *nvmlLib) DeviceCount() (int, nvmlReturn) {
	var n uint32
	ret := l.count(&n)
	return int(n), ret
}

func (l *nvmlLib) DeviceByIndex(i int) (nvmlDevice, nvmlReturn) {
	if i < 0 || i > math.MaxUint32 {
		return nil, errInvalidArgument
	}
	var h uintptr
	if ret := l.byIndex(uint32(i), &h); ret != nvmlSuccess {
		return nil, ret
	}
	return &nvmlLibDevice{lib: l, h: h}, nvmlSuccess
}

// nvmlLibDevice is one nvmlDevice_t of an nvmlLib.
type nvmlLibDevice struct {
	lib *nvmlLib
	h   uintptr
}

// cString reads a NUL-terminated string out of buf.
func cString(buf []byte) string {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(buf)
}

func (d *nvmlLibDevice) UUID() (string, nvmlReturn) {
	if d.lib.uuid == nil {
		return "", errFunctionNotFound
	}
	var buf [uuidBufferSize]byte
	ret := d.lib.uuid(d.h, &buf[0], uint32(len(buf)))
	return cString(buf[:]), ret
}

func (d *nvmlLibDevice) Name() (string, nvmlReturn) {
	if d.lib.name == nil {
		return "", errFunctionNotFound
	}
	var buf [nameBufferSize]byte
	ret := d.lib.name(d.h, &buf[0], uint32(len(buf)))
	return cString(buf[:]), ret
}

func (d *nvmlLibDevice) MemoryInfo() (nvmlMemory, nvmlReturn) {
	if d.lib.memory == nil {
		return nvmlMemory{}, errFunctionNotFound
	}
	var m cMemory
	ret := d.lib.memory(d.h, &m)
	return nvmlMemory{Total: m.Total, Free: m.Free, Used: m.Used}, ret
}

func (d *nvmlLibDevice) MemoryInfoV2() (nvmlMemory, nvmlReturn) {
	if d.lib.memoryV2 == nil {
		return nvmlMemory{}, errFunctionNotFound
	}
	m := cMemoryV2{Version: cMemoryV2Version}
	ret := d.lib.memoryV2(d.h, &m)
	return nvmlMemory{Total: m.Total, Free: m.Free, Used: m.Used}, ret
}

// uint32Call and uint64Call make a call whose one result is an unsigned
// int or an unsigned long long.
func uint32Call(fn func(uintptr, *uint32) nvmlReturn, h uintptr) (uint32, nvmlReturn) {
	if fn == nil {
		return 0, errFunctionNotFound
	}
	var v uint32
	ret := fn(h, &v)
	return v, ret
}

func uint64Call(fn func(uintptr, *uint64) nvmlReturn, h uintptr) (uint64, nvmlReturn) {
	if fn == nil {
		return 0, errFunctionNotFound
	}
	var v uint64
	ret := fn(h, &v)
	return v, ret
}

func clockCall(fn func(uintptr, nvmlClock, *uint32) nvmlReturn, h uintptr, c nvmlClock) (uint32, nvmlReturn) {
	if fn == nil {
		return 0, errFunctionNotFound
	}
	var v uint32
	ret := fn(h, c, &v)
	return v, ret
}

func (d *nvmlLibDevice) ClockInfo(c nvmlClock) (uint32, nvmlReturn) {
	return clockCall(d.lib.clock, d.h, c)
}

func (d *nvmlLibDevice) MaxClockInfo(c nvmlClock) (uint32, nvmlReturn) {
	return clockCall(d.lib.maxClock, d.h, c)
}

func (d *nvmlLibDevice) ClocksEventReasons() (uint64, nvmlReturn) {
	return uint64Call(d.lib.events, d.h)
}

func (d *nvmlLibDevice) ClocksThrottleReasons() (uint64, nvmlReturn) {
	return uint64Call(d.lib.throttle, d.h)
}

func (d *nvmlLibDevice) Temperature() (uint32, nvmlReturn) {
	if d.lib.temperature == nil {
		return 0, errFunctionNotFound
	}
	var v uint32
	ret := d.lib.temperature(d.h, temperatureGPU, &v)
	return v, ret
}

func (d *nvmlLibDevice) PowerUsage() (uint32, nvmlReturn) { return uint32Call(d.lib.power, d.h) }

func (d *nvmlLibDevice) EnforcedPowerLimit() (uint32, nvmlReturn) {
	return uint32Call(d.lib.powerLimit, d.h)
}

func (d *nvmlLibDevice) Utilization() (nvmlUtilization, nvmlReturn) {
	if d.lib.utilization == nil {
		return nvmlUtilization{}, errFunctionNotFound
	}
	var u cUtilization
	ret := d.lib.utilization(d.h, &u)
	return nvmlUtilization{GPU: u.GPU, Memory: u.Memory}, ret
}

// processAttempts bounds the ask-size, allocate, fetch loop: processes may
// start between the two calls, so the list is fetched with room to spare and
// asked again if it still did not fit.
const processAttempts = 4

func (d *nvmlLibDevice) ComputeProcesses() ([]nvmlProcess, nvmlReturn) {
	switch {
	case d.lib.processesV2 != nil:
		return fetchProcesses(func(n *uint32, infos []cProcessInfoV2) nvmlReturn {
			return d.lib.processesV2(d.h, n, first(infos))
		}, func(p cProcessInfoV2) nvmlProcess { return nvmlProcess{PID: p.PID, UsedMemory: p.UsedGPUMemory} })
	case d.lib.processesV1 != nil:
		return fetchProcesses(func(n *uint32, infos []cProcessInfoV1) nvmlReturn {
			return d.lib.processesV1(d.h, n, first(infos))
		}, func(p cProcessInfoV1) nvmlProcess { return nvmlProcess{PID: p.PID, UsedMemory: p.UsedGPUMemory} })
	}
	return nil, errFunctionNotFound
}

// first is the address of infos[0], or nil for an empty slice (NVML's
// "how many are there?" call).
func first[T any](infos []T) *T {
	if len(infos) == 0 {
		return nil
	}
	return &infos[0]
}

// fetchProcesses runs NVML's two-step list protocol: a call with no room
// answers SUCCESS (none) or INSUFFICIENT_SIZE with the count needed.
func fetchProcesses[T any](call func(n *uint32, infos []T) nvmlReturn, conv func(T) nvmlProcess) ([]nvmlProcess, nvmlReturn) {
	var infos []T
	for range processAttempts {
		n := uint32(len(infos))
		ret := call(&n, infos)
		if ret == nvmlSuccess {
			out := make([]nvmlProcess, 0, min(int(n), len(infos)))
			for _, p := range infos[:min(int(n), len(infos))] {
				out = append(out, conv(p))
			}
			return out, nvmlSuccess
		}
		if ret != errInsufficientSize {
			return nil, ret
		}
		infos = make([]T, n+n/2+4)
	}
	return nil, errInsufficientSize
}
