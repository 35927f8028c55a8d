//go:build linux

package gpu

import "fmt"

// The NVML subset the Source reads, as Go types. The library behind it is
// libnvidia-ml loaded without cgo (nvmllib_linux.go); tests put go-nvml's
// mock behind the same interfaces.

// nvmlLibrary is one loaded NVML.
type nvmlLibrary interface {
	Init() nvmlReturn
	Shutdown() nvmlReturn
	// HasSymbol says whether the driver's library exports name. Calls
	// whose symbol is missing return errFunctionNotFound.
	HasSymbol(name string) bool
	DeviceCount() (int, nvmlReturn)
	DeviceByIndex(i int) (nvmlDevice, nvmlReturn)
}

// nvmlDevice is one GPU's handle. Each method is one NVML call.
type nvmlDevice interface {
	UUID() (string, nvmlReturn)
	Name() (string, nvmlReturn)
	MemoryInfo() (nvmlMemory, nvmlReturn)   // nvmlDeviceGetMemoryInfo: Used includes the driver's reserve
	MemoryInfoV2() (nvmlMemory, nvmlReturn) // nvmlDeviceGetMemoryInfo_v2: Used is allocations only
	ClockInfo(clock nvmlClock) (uint32, nvmlReturn)
	MaxClockInfo(clock nvmlClock) (uint32, nvmlReturn)
	ClocksEventReasons() (uint64, nvmlReturn)    // NVML 12.2 and later
	ClocksThrottleReasons() (uint64, nvmlReturn) // the same mask under its older name
	Temperature() (uint32, nvmlReturn)           // the GPU die sensor, °C
	PowerUsage() (uint32, nvmlReturn)            // mW
	EnforcedPowerLimit() (uint32, nvmlReturn)    // mW
	Utilization() (nvmlUtilization, nvmlReturn)
	ComputeProcesses() ([]nvmlProcess, nvmlReturn)
}

type nvmlMemory struct{ Total, Free, Used uint64 }

type nvmlUtilization struct{ GPU, Memory uint32 }

type nvmlProcess struct {
	PID        uint32
	UsedMemory uint64 // nvmlValueNotAvailable when NVML will not say
}

// nvmlValueNotAvailable is NVML_VALUE_NOT_AVAILABLE in an unsigned long long.
const nvmlValueNotAvailable = ^uint64(0)

// nvmlClock is nvmlClockType_t.
type nvmlClock uint32

const (
	clockSM  nvmlClock = 1 // NVML_CLOCK_SM
	clockMem nvmlClock = 2 // NVML_CLOCK_MEM
)

// temperatureGPU is NVML_TEMPERATURE_GPU, the die sensor.
const temperatureGPU = 0

// nvmlReturn is nvmlReturn_t. It is an error so that callers can wrap it
// and test for a code with errors.Is.
type nvmlReturn uint32

// The codes the agent tells apart, with nvml.h's values.
const (
	nvmlSuccess                nvmlReturn = 0
	errUninitialized           nvmlReturn = 1
	errInvalidArgument         nvmlReturn = 2
	errNotSupported            nvmlReturn = 3
	errNoPermission            nvmlReturn = 4
	errNotFound                nvmlReturn = 6
	errInsufficientSize        nvmlReturn = 7
	errDriverNotLoaded         nvmlReturn = 9
	errLibraryNotFound         nvmlReturn = 12
	errFunctionNotFound        nvmlReturn = 13
	errGPUIsLost               nvmlReturn = 15
	errLibRMVersionMismatch    nvmlReturn = 18
	errArgumentVersionMismatch nvmlReturn = 25
	errUnknown                 nvmlReturn = 999
)

// nvmlReturnNames are short descriptions of every code nvml.h defines,
// so an error reads the same with or without a loaded library.
var nvmlReturnNames = map[nvmlReturn]string{
	0: "success", 1: "not initialised", 2: "invalid argument", 3: "not supported",
	4: "no permission", 5: "already initialised", 6: "not found", 7: "insufficient size",
	8: "insufficient power", 9: "driver not loaded", 10: "timeout", 11: "interrupt issue",
	12: "library not found", 13: "function not found", 14: "corrupted infoROM", 15: "gpu is lost",
	16: "reset required", 17: "blocked by the operating system", 18: "library and driver versions differ",
	19: "in use", 20: "out of memory", 21: "no data", 22: "vgpu ecc not supported",
	23: "insufficient resources", 24: "frequency not supported", 25: "argument version mismatch",
	26: "deprecated", 27: "not ready", 28: "gpu not found", 29: "invalid state",
	30: "reset type not supported", 999: "unknown error",
}

func (r nvmlReturn) Error() string {
	if name, ok := nvmlReturnNames[r]; ok {
		return fmt.Sprintf("nvml: %s (%d)", name, uint32(r))
	}
	return fmt.Sprintf("nvml: error %d", uint32(r))
}
