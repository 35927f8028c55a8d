//go:build linux && cgo

package gpu

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// goNVML puts go-nvml's Interface behind nvmlLibrary: in these tests its
// mock of a DGX H100 drives the Source's mapping, and on a GPU host its cgo
// binding is the reference the purego one is compared with.
type goNVML struct{ lib nvml.Interface }

func (g goNVML) Init() nvmlReturn           { return nvmlReturn(g.lib.Init()) }
func (g goNVML) Shutdown() nvmlReturn       { return nvmlReturn(g.lib.Shutdown()) }
func (g goNVML) HasSymbol(name string) bool { return g.lib.Extensions().LookupSymbol(name) == nil }
func (g goNVML) DeviceCount() (int, nvmlReturn) {
	n, ret := g.lib.DeviceGetCount()
	return n, nvmlReturn(ret)
}

func (g goNVML) DeviceByIndex(i int) (nvmlDevice, nvmlReturn) {
	d, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, nvmlReturn(ret)
	}
	return goNVMLDevice{d}, nvmlSuccess
}

type goNVMLDevice struct{ d nvml.Device }

func (d goNVMLDevice) UUID() (string, nvmlReturn) { v, ret := d.d.GetUUID(); return v, nvmlReturn(ret) }
func (d goNVMLDevice) Name() (string, nvmlReturn) { v, ret := d.d.GetName(); return v, nvmlReturn(ret) }

func (d goNVMLDevice) MemoryInfo() (nvmlMemory, nvmlReturn) {
	m, ret := d.d.GetMemoryInfo()
	return nvmlMemory{Total: m.Total, Free: m.Free, Used: m.Used}, nvmlReturn(ret)
}

func (d goNVMLDevice) MemoryInfoV2() (nvmlMemory, nvmlReturn) {
	m, ret := d.d.GetMemoryInfo_v2()
	return nvmlMemory{Total: m.Total, Free: m.Free, Used: m.Used}, nvmlReturn(ret)
}

func (d goNVMLDevice) ClockInfo(c nvmlClock) (uint32, nvmlReturn) {
	v, ret := d.d.GetClockInfo(nvml.ClockType(c))
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) MaxClockInfo(c nvmlClock) (uint32, nvmlReturn) {
	v, ret := d.d.GetMaxClockInfo(nvml.ClockType(c))
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) ClocksEventReasons() (uint64, nvmlReturn) {
	v, ret := d.d.GetCurrentClocksEventReasons()
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) ClocksThrottleReasons() (uint64, nvmlReturn) {
	v, ret := d.d.GetCurrentClocksThrottleReasons()
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) Temperature() (uint32, nvmlReturn) {
	v, ret := d.d.GetTemperature(nvml.TEMPERATURE_GPU)
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) PowerUsage() (uint32, nvmlReturn) {
	v, ret := d.d.GetPowerUsage()
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) EnforcedPowerLimit() (uint32, nvmlReturn) {
	v, ret := d.d.GetEnforcedPowerLimit()
	return v, nvmlReturn(ret)
}

func (d goNVMLDevice) Utilization() (nvmlUtilization, nvmlReturn) {
	u, ret := d.d.GetUtilizationRates()
	return nvmlUtilization{GPU: u.Gpu, Memory: u.Memory}, nvmlReturn(ret)
}

func (d goNVMLDevice) ComputeProcesses() ([]nvmlProcess, nvmlReturn) {
	ps, ret := d.d.GetComputeRunningProcesses()
	out := make([]nvmlProcess, len(ps))
	for i, p := range ps {
		out[i] = nvmlProcess{PID: p.Pid, UsedMemory: p.UsedGpuMemory}
	}
	return out, nvmlReturn(ret)
}
