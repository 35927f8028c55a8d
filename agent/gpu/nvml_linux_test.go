//go:build linux && cgo

package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/wire"
)

const gib = 1 << 30

// fakeH100s is go-nvml's 8-GPU DGX H100 mock with every query the Source
// makes wired to fixed, per-device values.
func fakeH100s(t testing.TB) *server.Server {
	srv := dgxh100.New()
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i) // the mock's are random
		dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: 80 * gib, Reserved: gib / 2, Free: 60 * gib, Used: 19*gib + gib/2}, nvml.SUCCESS
		}
		dev.MemoryInfo = nvml.Memory{Total: 80 * gib, Free: 60 * gib, Used: 20 * gib} // the v1 answer
		dev.GetClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			switch c {
			case nvml.CLOCK_SM:
				return 1755, nvml.SUCCESS
			case nvml.CLOCK_MEM:
				return 2619, nvml.SUCCESS
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		dev.GetMaxClockInfoFunc = func(c nvml.ClockType) (uint32, nvml.Return) {
			switch c {
			case nvml.CLOCK_SM:
				return 1980, nvml.SUCCESS
			case nvml.CLOCK_MEM:
				return 2619, nvml.SUCCESS
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			return nvml.ClocksEventReasonSwPowerCap | nvml.ClocksThrottleReasonHwSlowdown, nvml.SUCCESS
		}
		dev.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) {
			return nvml.ClocksEventReasonSwThermalSlowdown, nvml.SUCCESS
		}
		dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
			if s != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return 61, nvml.SUCCESS
		}
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 512345, nvml.SUCCESS }
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700000, nvml.SUCCESS }
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: 97, Memory: 40}, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{
				{Pid: 4242, UsedGpuMemory: 70 * gib},
				{Pid: 4243, UsedGpuMemory: ^uint64(0)}, // NVML_VALUE_NOT_AVAILABLE
				{Pid: 999999, UsedGpuMemory: gib},      // exited: no /proc entry
			}, nvml.SUCCESS
		}
	}
	return srv
}

// missingSymbols makes the mock behave like a driver that lacks names.
func missingSymbols(srv *server.Server, names ...string) {
	srv.LookupSymbolFunc = func(symbol string) error {
		if len(names) == 0 || slices.Contains(names, symbol) {
			return fmt.Errorf("undefined symbol: %s", symbol)
		}
		return nil
	}
}

func newSource(t testing.TB, srv *server.Server) *nvmlSource {
	t.Helper()
	s, err := newNVMLSource(goNVML{srv}, testLogger(t))
	if err != nil {
		t.Fatalf("newNVMLSource: %v", err)
	}
	s.procRoot = testutil.Testdata(t, "proc", "gpu-host")
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNVMLMapsEveryField(t *testing.T) {
	srv := fakeH100s(t)
	gpus := devices(t, newSource(t, srv))
	if len(gpus) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(gpus))
	}
	want := wire.GPU{
		Index:              5,
		UUID:               "GPU-00000000-0000-0000-0000-000000000005",
		Name:               "NVIDIA H100 80GB HBM3",
		MemoryTotal:        80 * gib,
		MemoryFree:         60 * gib,
		MemoryUsed:         19*gib + gib/2, // v2: without the driver's reserve
		SMClockMHz:         1755,
		SMClockMaxMHz:      1980,
		MemClockMHz:        2619,
		MemClockMaxMHz:     2619,
		ClockEventReasons:  []string{"sw_power_cap", "hw_slowdown"},
		TemperatureC:       61,
		PowerDrawW:         512.345,
		PowerLimitW:        700,
		UtilizationPercent: 97,
		Processes: []wire.GPUProcess{
			{PID: 4242, Name: "VLLM::EngineCor", UsedMemory: 70 * gib},
			{PID: 4243, Name: "python3", UsedMemory: 0},
			{PID: 999999, UsedMemory: gib},
		},
	}
	if !reflect.DeepEqual(gpus[5], want) {
		t.Errorf("gpu 5:\n got %+v\nwant %+v", gpus[5], want)
	}
	for i, g := range gpus {
		if g.Index != i || g.Error != "" || len(g.Unsupported) != 0 {
			t.Errorf("gpu %d: index %d, error %q, unsupported %q", i, g.Index, g.Error, g.Unsupported)
		}
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		if n := len(dev.GetCurrentClocksThrottleReasonsCalls()); n != 0 {
			t.Errorf("gpu %d: deprecated throttle call made %d times though the event symbol exists", i, n)
		}
		if n := len(dev.GetMemoryInfoCalls()); n != 0 {
			t.Errorf("gpu %d: v1 memory call made %d times though the v2 symbol exists", i, n)
		}
	}
}

func TestNVMLOldDriverFallsBack(t *testing.T) {
	srv := fakeH100s(t)
	missingSymbols(srv) // a driver older than NVML 12.2: no symbol is found
	s := newSource(t, srv)
	if s.hasEvents || s.hasMemV2 {
		t.Fatalf("symbols cached as present: events %v, memory v2 %v", s.hasEvents, s.hasMemV2)
	}
	gpus := devices(t, s)
	for i, g := range gpus {
		if !reflect.DeepEqual(g.ClockEventReasons, []string{"sw_thermal_slowdown"}) {
			t.Errorf("gpu %d: reasons %q, want the throttle call's", i, g.ClockEventReasons)
		}
		if g.MemoryUsed != 20*gib || g.MemoryFree != 60*gib {
			t.Errorf("gpu %d: memory used %d free %d, want the v1 answer", i, g.MemoryUsed, g.MemoryFree)
		}
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		// On a real old driver either call would abort the process.
		if n := len(dev.GetCurrentClocksEventReasonsCalls()); n != 0 {
			t.Errorf("gpu %d: GetCurrentClocksEventReasons called %d times with its symbol missing", i, n)
		}
		if n := len(dev.GetMemoryInfo_v2Calls()); n != 0 {
			t.Errorf("gpu %d: GetMemoryInfo_v2 called %d times with its symbol missing", i, n)
		}
		if n := len(dev.GetCurrentClocksThrottleReasonsCalls()); n != 1 {
			t.Errorf("gpu %d: throttle call made %d times, want 1", i, n)
		}
	}
}

func TestNVMLOneDeviceFailing(t *testing.T) {
	srv := fakeH100s(t)
	missingSymbols(srv, symMemoryInfoV2) // the v1 memory call is the one that fails
	lost := srv.Devices[3].(*server.Device)
	lost.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	flaky := srv.Devices[1].(*server.Device)
	flaky.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	flaky.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NO_PERMISSION }
	handleless := 6
	byIndex := srv.DeviceGetHandleByIndexFunc
	srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == handleless {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byIndex(i)
	}

	gpus := devices(t, newSource(t, srv))
	if len(gpus) != 8 {
		t.Fatalf("got %d GPUs, want all 8", len(gpus))
	}
	g := gpus[3]
	if !strings.Contains(g.Error, "memory info") || !strings.Contains(g.Error, errGPUIsLost.Error()) {
		t.Errorf("gpu 3 error = %q, want the lost GPU named", g.Error)
	}
	if g.UUID == "" || g.Name == "" {
		t.Errorf("gpu 3 lost what was read before the failure: %+v", g)
	}
	if n := len(lost.GetClockInfoCalls()); n != 0 {
		t.Errorf("lost gpu still queried for clocks %d times", n)
	}

	g = gpus[1]
	for _, part := range []string{"temperature: " + errUnknown.Error(), "power draw: " + errNoPermission.Error()} {
		if !strings.Contains(g.Error, part) {
			t.Errorf("gpu 1 error = %q, lacks %q", g.Error, part)
		}
	}
	if g.SMClockMHz != 1755 || g.PowerLimitW != 700 || len(g.Processes) != 3 {
		t.Errorf("gpu 1: other fields not read after a failure: %+v", g)
	}

	if g := gpus[handleless]; g.Index != handleless || !strings.Contains(g.Error, "device handle") {
		t.Errorf("gpu %d = %+v, want its index and a handle error", handleless, g)
	}
	for _, i := range []int{0, 2, 4, 5, 7} {
		if gpus[i].Error != "" || gpus[i].SMClockMHz != 1755 || gpus[i].MemoryTotal != 80*gib {
			t.Errorf("healthy gpu %d affected: %+v", i, gpus[i])
		}
	}
}

func TestNVMLNotSupported(t *testing.T) {
	srv := fakeH100s(t)
	for _, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_FUNCTION_NOT_FOUND }
	}
	gpus := devices(t, newSource(t, srv))
	want := []string{"memory_total_bytes", "memory_free_bytes", "memory_used_bytes",
		"sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w", "processes"}
	for i, g := range gpus {
		if g.Error != "" {
			t.Errorf("gpu %d: unsupported fields reported as error %q", i, g.Error)
		}
		if !reflect.DeepEqual(g.Unsupported, want) {
			t.Errorf("gpu %d: Unsupported = %q, want %q", i, g.Unsupported, want)
		}
		if g.PowerDrawW != 512.345 || g.SMClockMHz != 1755 {
			t.Errorf("gpu %d: supported fields missing: %+v", i, g)
		}
	}
}

func TestNVMLInitFailure(t *testing.T) {
	tests := []struct {
		ret  nvml.Return
		says string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "cannot load the NVML library libnvidia-ml.so.1"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, "/dev/nvidia*"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "differ in version"},
		{nvml.ERROR_UNKNOWN, "NVML initialisation failed"},
	}
	for _, tc := range tests {
		t.Run(tc.ret.Error(), func(t *testing.T) {
			srv := fakeH100s(t)
			srv.InitFunc = func() nvml.Return { return tc.ret }
			src, err := openWith(goNVML{srv}, testLogger(t))
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, nvmlReturn(tc.ret)) {
				t.Fatalf("err = %v, want one wrapping ErrUnavailable and %v", err, tc.ret)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("err = %q, want it to say %q", err, tc.says)
			}
			gpus, derr := src.Devices(context.Background())
			if derr != nil || len(gpus) != 0 {
				t.Errorf("fallback Source gave %d GPUs, %v; want none and no error", len(gpus), derr)
			}
			if err := src.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if n := len(srv.DeviceGetCountCalls()); n != 0 {
				t.Errorf("device count queried %d times after a failed init", n)
			}
		})
	}
}

func TestNVMLCloseAndCount(t *testing.T) {
	t.Run("count fails", func(t *testing.T) {
		srv := fakeH100s(t)
		srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		if _, err := newSource(t, srv).Devices(context.Background()); !errors.Is(err, errUnknown) {
			t.Errorf("err = %v, want ERROR_UNKNOWN", err)
		}
	})
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := newSource(t, fakeH100s(t)).Devices(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
	t.Run("close shuts down once", func(t *testing.T) {
		srv := fakeH100s(t)
		s := newSource(t, srv)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if n := len(srv.ShutdownCalls()); n != 1 {
			t.Errorf("Shutdown called %d times, want 1", n)
		}
		if _, err := s.Devices(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("Devices after Close: %v, want ErrClosed", err)
		}
	})
	t.Run("shutdown error", func(t *testing.T) {
		srv := fakeH100s(t)
		srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
		if err := newSource(t, srv).Close(); !errors.Is(err, errUnknown) {
			t.Errorf("Close = %v, want ERROR_UNKNOWN", err)
		}
	})
}

// Concurrent reads of one source (the collector's poll and a probe's
// clock sampler) each get the whole, right answer: the one a read alone gets.
func TestNVMLConcurrentDevices(t *testing.T) {
	s := newSource(t, fakeH100s(t))
	want := devices(t, s)
	if len(want) != 8 {
		t.Fatalf("a read alone found %d GPUs, want the mock's 8", len(want))
	}
	type result struct {
		gpus []wire.GPU
		err  error
	}
	const readers = 8
	done := make(chan result, readers)
	for range readers {
		go func() {
			gpus, err := s.Devices(context.Background())
			done <- result{gpus, err}
		}()
	}
	for i := range readers {
		r := <-done
		if r.err != nil {
			t.Errorf("reader %d: %v", i, r.err)
			continue
		}
		if !reflect.DeepEqual(r.gpus, want) {
			t.Errorf("reader %d got other GPUs than a read alone:\n got %+v\nwant %+v", i, r.gpus, want)
		}
	}
}

func BenchmarkNVMLDevices(b *testing.B) {
	s := newSource(b, fakeH100s(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Devices(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRealNVML runs against the host's driver; it needs a GPU, so it runs
// only when HEFT_TEST_REAL_NVML=1.
func TestRealNVML(t *testing.T) {
	if os.Getenv("HEFT_TEST_REAL_NVML") != "1" {
		t.Skip("set HEFT_TEST_REAL_NVML=1 on a GPU host")
	}
	src, err := Open(testLogger(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer src.Close()
	s := src.(*nvmlSource)
	t.Logf("symbols: clock events %v, memory v2 %v", s.hasEvents, s.hasMemV2)
	check := func(label string) []wire.GPU {
		gpus := devices(t, s)
		if len(gpus) == 0 {
			t.Fatalf("%s: no GPUs", label)
		}
		for _, g := range gpus {
			js, _ := json.Marshal(g)
			t.Logf("%s: %s", label, js)
			if g.Error != "" || !strings.HasPrefix(g.UUID, "GPU-") || g.Name == "" || g.MemoryTotal == 0 ||
				g.MemoryFree > g.MemoryTotal || g.SMClockMaxMHz == 0 || g.MemClockMaxMHz == 0 {
				t.Errorf("%s: implausible GPU %+v", label, g)
			}
		}
		return gpus
	}
	now := check("current API")
	// The old-driver path against this driver: the deprecated calls must
	// still answer, and v1 "used" includes the reserve v2 leaves out.
	s.hasEvents, s.hasMemV2 = false, false
	old := check("old-driver path")
	for i := range now {
		if old[i].MemoryTotal != now[i].MemoryTotal || old[i].MemoryUsed < now[i].MemoryUsed {
			t.Errorf("gpu %d: v1 memory %d/%d vs v2 %d/%d", i, old[i].MemoryUsed, old[i].MemoryTotal, now[i].MemoryUsed, now[i].MemoryTotal)
		}
	}

	// The purego binding against go-nvml's cgo one on the same driver: the
	// facts that do not move between two reads must be equal.
	ref, err := newNVMLSource(goNVML{nvml.New()}, testLogger(t))
	if err != nil {
		t.Fatalf("go-nvml: %v", err)
	}
	defer ref.Close()
	s.hasEvents, s.hasMemV2 = ref.hasEvents, ref.hasMemV2
	ours, theirs := devices(t, s), devices(t, ref)
	if len(ours) != len(theirs) {
		t.Fatalf("purego sees %d GPUs, go-nvml %d", len(ours), len(theirs))
	}
	for i := range ours {
		a, b := ours[i], theirs[i]
		if a.UUID != b.UUID || a.Name != b.Name || a.MemoryTotal != b.MemoryTotal || a.SMClockMaxMHz != b.SMClockMaxMHz ||
			a.MemClockMaxMHz != b.MemClockMaxMHz || a.PowerLimitW != b.PowerLimitW || !slices.Equal(a.Unsupported, b.Unsupported) {
			t.Errorf("gpu %d differs:\n purego  %+v\n go-nvml %+v", i, a, b)
		}
	}
}

func BenchmarkRealNVMLDevices(b *testing.B) {
	if os.Getenv("HEFT_TEST_REAL_NVML") != "1" {
		b.Skip("set HEFT_TEST_REAL_NVML=1 on a GPU host")
	}
	src, err := Open(hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	for b.Loop() {
		if _, err := src.Devices(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
