//go:build linux

package gpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// These tests drive the purego binding through a real dlopen of a stand-in
// libnvidia-ml (testdata/nvml/fakenvml.c) compiled against the real nvml.h,
// the one go-nvml ships. They run with and without cgo; they need gcc.

// nvmlHeaderDir is the folder of go-nvml's nvml.h in the module cache.
func nvmlHeaderDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	if _, serr := os.Stat(filepath.Join(dir, "nvml.h")); err != nil || serr != nil {
		t.Fatalf("cannot find go-nvml's nvml.h (go list: %v): %v", err, serr)
	}
	return dir
}

// gcc compiles testdata/nvml/<src> against nvml.h with extra flags into out.
func gcc(t *testing.T, out, src string, flags ...string) {
	t.Helper()
	gccFile(t, out, testutil.Testdata(t, "nvml", src), flags...)
}

// gccFile compiles the C file at src against nvml.h with extra flags into out.
func gccFile(t *testing.T, out, src string, flags ...string) {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("gcc is missing (.ci/run should have installed it)")
		}
		t.Skip("gcc not installed")
	}
	args := append([]string{"-Wall", "-Werror", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", nvmlHeaderDir(t), "-o", out, src}, flags...)
	if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// fakeLibrary builds the stand-in library into a fresh folder (a fresh
// path is a fresh dlopen, so tests share no state) and returns its path.
func fakeLibrary(t *testing.T, flags ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), libraryName)
	gcc(t, path, "fakenvml.c", append([]string{"-shared", "-fPIC"}, flags...)...)
	return path
}

// hook calls one of the fake's test hooks.
func hook[F any](t *testing.T, path, name string) F {
	t.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var fn F
	purego.RegisterLibFunc(&fn, h, name)
	return fn
}

func openFake(t *testing.T, path string) *nvmlSource {
	t.Helper()
	src, err := openLibrary(path, testLogger(t))
	if err != nil {
		t.Fatalf("openLibrary: %v", err)
	}
	s := src.(*nvmlSource)
	s.procRoot = testutil.Testdata(t, "proc", "gpu-host")
	t.Cleanup(func() { s.Close() })
	return s
}

func devices(t *testing.T, s Source) []wire.GPU {
	t.Helper()
	gpus, err := s.Devices(context.Background())
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for i := range gpus {
		if err := gpus[i].Validate(); err != nil {
			t.Errorf("gpu %d fails wire validation: %v", i, err)
		}
	}
	return gpus
}

func TestNVMLStructLayoutsMatchHeader(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "layout")
	gcc(t, bin, "layout.c")
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	header := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		v, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		if err != nil {
			t.Fatalf("layout line %q: %v", sc.Text(), err)
		}
		header[strings.Join(f[:len(f)-1], " ")] = v
	}
	notAvailable := nvmlValueNotAvailable // a variable, so int64 may wrap it
	ours := map[string]int64{
		"sizeof nvmlMemory_t":                                int64(unsafe.Sizeof(cMemory{})),
		"offsetof nvmlMemory_t.total":                        int64(unsafe.Offsetof(cMemory{}.Total)),
		"offsetof nvmlMemory_t.free":                         int64(unsafe.Offsetof(cMemory{}.Free)),
		"offsetof nvmlMemory_t.used":                         int64(unsafe.Offsetof(cMemory{}.Used)),
		"sizeof nvmlMemory_v2_t":                             int64(unsafe.Sizeof(cMemoryV2{})),
		"offsetof nvmlMemory_v2_t.version":                   int64(unsafe.Offsetof(cMemoryV2{}.Version)),
		"offsetof nvmlMemory_v2_t.total":                     int64(unsafe.Offsetof(cMemoryV2{}.Total)),
		"offsetof nvmlMemory_v2_t.reserved":                  int64(unsafe.Offsetof(cMemoryV2{}.Reserved)),
		"offsetof nvmlMemory_v2_t.free":                      int64(unsafe.Offsetof(cMemoryV2{}.Free)),
		"offsetof nvmlMemory_v2_t.used":                      int64(unsafe.Offsetof(cMemoryV2{}.Used)),
		"sizeof nvmlUtilization_t":                           int64(unsafe.Sizeof(cUtilization{})),
		"offsetof nvmlUtilization_t.gpu":                     int64(unsafe.Offsetof(cUtilization{}.GPU)),
		"offsetof nvmlUtilization_t.memory":                  int64(unsafe.Offsetof(cUtilization{}.Memory)),
		"sizeof nvmlProcessInfo_v1_t":                        int64(unsafe.Sizeof(cProcessInfoV1{})),
		"offsetof nvmlProcessInfo_v1_t.pid":                  int64(unsafe.Offsetof(cProcessInfoV1{}.PID)),
		"offsetof nvmlProcessInfo_v1_t.usedGpuMemory":        int64(unsafe.Offsetof(cProcessInfoV1{}.UsedGPUMemory)),
		"sizeof nvmlProcessInfo_t":                           int64(unsafe.Sizeof(cProcessInfoV2{})),
		"offsetof nvmlProcessInfo_t.pid":                     int64(unsafe.Offsetof(cProcessInfoV2{}.PID)),
		"offsetof nvmlProcessInfo_t.usedGpuMemory":           int64(unsafe.Offsetof(cProcessInfoV2{}.UsedGPUMemory)),
		"offsetof nvmlProcessInfo_t.gpuInstanceId":           int64(unsafe.Offsetof(cProcessInfoV2{}.GPUInstanceID)),
		"offsetof nvmlProcessInfo_t.computeInstanceId":       int64(unsafe.Offsetof(cProcessInfoV2{}.ComputeInstanceID)),
		"sizeof nvmlDevice_t":                                int64(unsafe.Sizeof(uintptr(0))),
		"sizeof nvmlReturn_t":                                int64(unsafe.Sizeof(nvmlSuccess)),
		"sizeof nvmlClockType_t":                             int64(unsafe.Sizeof(clockSM)),
		"const nvmlMemory_v2":                                cMemoryV2Version,
		"const NVML_DEVICE_UUID_V2_BUFFER_SIZE":              uuidBufferSize,
		"const NVML_DEVICE_NAME_V2_BUFFER_SIZE":              nameBufferSize,
		"const NVML_CLOCK_SM":                                int64(clockSM),
		"const NVML_CLOCK_MEM":                               int64(clockMem),
		"const NVML_TEMPERATURE_GPU":                         temperatureGPU,
		"const NVML_SUCCESS":                                 int64(nvmlSuccess),
		"const NVML_ERROR_UNINITIALIZED":                     int64(errUninitialized),
		"const NVML_ERROR_INVALID_ARGUMENT":                  int64(errInvalidArgument),
		"const NVML_ERROR_NOT_SUPPORTED":                     int64(errNotSupported),
		"const NVML_ERROR_NO_PERMISSION":                     int64(errNoPermission),
		"const NVML_ERROR_NOT_FOUND":                         int64(errNotFound),
		"const NVML_ERROR_INSUFFICIENT_SIZE":                 int64(errInsufficientSize),
		"const NVML_ERROR_DRIVER_NOT_LOADED":                 int64(errDriverNotLoaded),
		"const NVML_ERROR_LIBRARY_NOT_FOUND":                 int64(errLibraryNotFound),
		"const NVML_ERROR_FUNCTION_NOT_FOUND":                int64(errFunctionNotFound),
		"const NVML_ERROR_GPU_IS_LOST":                       int64(errGPUIsLost),
		"const NVML_ERROR_LIB_RM_VERSION_MISMATCH":           int64(errLibRMVersionMismatch),
		"const NVML_ERROR_ARGUMENT_VERSION_MISMATCH":         int64(errArgumentVersionMismatch),
		"const NVML_ERROR_UNKNOWN":                           int64(errUnknown),
		"const (unsigned long long)NVML_VALUE_NOT_AVAILABLE": int64(notAvailable), // printed as a long long
	}
	for name, want := range header {
		got, ok := ours[name]
		if !ok {
			t.Errorf("layout.c prints %q, which the test does not compare", name)
			continue
		}
		if got != want {
			t.Errorf("%s: Go has %d, nvml.h %d", name, got, want)
		}
	}
	if len(header) != len(ours) {
		t.Errorf("layout.c printed %d facts, the test compares %d", len(header), len(ours))
	}
}

func TestNVMLLibraryReadsEveryField(t *testing.T) {
	path := fakeLibrary(t)
	s := openFake(t, path)
	if !s.hasEvents || !s.hasMemV2 {
		t.Fatalf("symbols found: events %v, memory v2 %v; the fake exports both", s.hasEvents, s.hasMemV2)
	}
	gpus := devices(t, s)
	if len(gpus) != 3 {
		t.Fatalf("got %d GPUs, want 3", len(gpus))
	}
	want := wire.GPU{
		Index: 0, UUID: "GPU-11111111-2222-3333-4444-000000000000", Name: "NVIDIA H200",
		MemoryTotal: 140 << 30, MemoryFree: 100 << 30, MemoryUsed: 39<<30 + 1<<29, // v2: without the reserve
		SMClockMHz: 1755, SMClockMaxMHz: 1980, MemClockMHz: 3201, MemClockMaxMHz: 3201,
		ClockEventReasons: []string{"sw_power_cap", "hw_slowdown", "unknown_0x10000000000"},
		TemperatureC:      61, PowerDrawW: 512.345, PowerLimitW: 700, UtilizationPercent: 97,
		Processes: []wire.GPUProcess{
			{PID: 4242, Name: "VLLM::EngineCor", UsedMemory: 1 << 30},
			{PID: 4243, Name: "python3", UsedMemory: 0}, // NVML_VALUE_NOT_AVAILABLE
			{PID: 999999, UsedMemory: 3 << 30},
			{PID: 5000, UsedMemory: 4 << 30},
			{PID: 5001, UsedMemory: 5 << 30},
		},
	}
	if !reflect.DeepEqual(gpus[0], want) {
		t.Errorf("gpu 0:\n got %+v\nwant %+v", gpus[0], want)
	}

	lost := gpus[1]
	if lost.UUID != "GPU-11111111-2222-3333-4444-000000000001" || !strings.Contains(lost.Error, "memory info: "+errGPUIsLost.Error()) {
		t.Errorf("gpu 1 = %+v, want its uuid and the lost GPU named", lost)
	}
	if n := hook[func() uint32](t, path, "fakeDevice1Calls")(); n != 3 {
		t.Errorf("the lost GPU got %d calls, want 3 (uuid, name, memory, then nothing)", n)
	}

	g := gpus[2]
	if g.Error != "" || g.SMClockMHz != 1757 || g.Processes != nil ||
		!reflect.DeepEqual(g.Unsupported, []string{"sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w"}) {
		t.Errorf("gpu 2 = %+v, want max clocks and power limit unsupported, no processes", g)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := hook[func() uint32](t, path, "fakeShutdowns")(); n != 1 {
		t.Errorf("nvmlShutdown called %d times, want 1", n)
	}
}

func TestNVMLLibraryOldDriver(t *testing.T) {
	s := openFake(t, fakeLibrary(t, "-DFAKE_OLD_DRIVER"))
	if s.hasEvents || s.hasMemV2 {
		t.Fatalf("symbols found: events %v, memory v2 %v; the old driver has neither", s.hasEvents, s.hasMemV2)
	}
	gpus := devices(t, s)
	if len(gpus) != 3 {
		t.Fatalf("got %d GPUs through the v1 calls, want 3", len(gpus))
	}
	g := gpus[0]
	if g.MemoryUsed != 40<<30 || !reflect.DeepEqual(g.ClockEventReasons, []string{"sw_thermal_slowdown"}) {
		t.Errorf("gpu 0: used %d, reasons %q; want v1 memory and the throttle call's mask", g.MemoryUsed, g.ClockEventReasons)
	}
	var pids []int
	for _, p := range g.Processes {
		pids = append(pids, p.PID)
	}
	// A v2-sized read of v1 structs would misplace every pid after the first.
	if !reflect.DeepEqual(pids, []int{4242, 4243, 999999, 5000, 5001}) || g.Processes[4].UsedMemory != 5<<30 {
		t.Errorf("processes through the v1 call: %+v", g.Processes)
	}
}

func TestNVMLLibraryInitFails(t *testing.T) {
	path := fakeLibrary(t)
	hook[func(int32)](t, path, "fakeSetInitReturn")(int32(errDriverNotLoaded))
	src, err := openLibrary(path, testLogger(t))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errDriverNotLoaded) || !strings.Contains(err.Error(), "kernel driver is not loaded") {
		t.Fatalf("err = %v, want the driver named", err)
	}
	if gpus, err := src.Devices(context.Background()); err != nil || len(gpus) != 0 {
		t.Errorf("fallback Source: %d GPUs, %v", len(gpus), err)
	}
}

func TestNVMLLibraryMissing(t *testing.T) {
	src, err := openLibrary("/nonexistent/"+libraryName, testLogger(t))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errLibraryNotFound) {
		t.Fatalf("err = %v, want errLibraryNotFound wrapped in ErrUnavailable", err)
	}
	// dlopen's own words reach the operator.
	if !strings.Contains(err.Error(), "No such file or directory") || !strings.Contains(err.Error(), "is the NVIDIA driver installed") {
		t.Errorf("err = %q", err)
	}
	if gpus, err := src.Devices(context.Background()); err != nil || len(gpus) != 0 {
		t.Errorf("Devices = %d GPUs, %v", len(gpus), err)
	}
}

func TestNVMLLibraryNotNVML(t *testing.T) {
	// Any shared library without nvmlInit: here the layout program's
	// source built as one.
	path := filepath.Join(t.TempDir(), "libother.so")
	gcc(t, path, "layout.c", "-shared", "-fPIC")
	_, err := openLibrary(path, testLogger(t))
	if !errors.Is(err, errLibraryNotFound) || !strings.Contains(err.Error(), "not an NVML library") {
		t.Fatalf("err = %v, want a library without nvmlInit refused", err)
	}
}

func TestNVMLReturnErrors(t *testing.T) {
	if got := errGPUIsLost.Error(); got != "nvml: gpu is lost (15)" {
		t.Errorf("errGPUIsLost = %q", got)
	}
	if got := nvmlReturn(4242).Error(); got != "nvml: error 4242" {
		t.Errorf("unknown code = %q", got)
	}
}

// The bench's stand-in libnvidia-ml (bench/nvml/standin.c) is read by this
// binding as the bench's area 11 expects: its GPU's throttle, clock and
// processes are what its state file says at each query. The library reads
// the file's path from its environment, which only a new process sets for
// C code, so the test runs itself again with it set.
func TestBenchStandinNVML(t *testing.T) {
	lib, state := os.Getenv("HEFT_TEST_STANDIN_LIB"), os.Getenv("HEFT_STANDIN_NVML_STATE")
	if lib == "" {
		dir := t.TempDir()
		lib = filepath.Join(dir, libraryName)
		gccFile(t, lib, filepath.Join(testutil.RepoRoot(t), "bench", "nvml", "standin.c"), "-shared", "-fPIC")
		cmd := exec.Command(os.Args[0], "-test.run=^TestBenchStandinNVML$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "HEFT_TEST_STANDIN_LIB="+lib, "HEFT_STANDIN_NVML_STATE="+filepath.Join(dir, "state"))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestBenchStandinNVML") {
			t.Fatalf("the test with the stand-in loaded: %v\n%s", err, out)
		}
		return
	}
	s := openFake(t, lib)
	if g := devices(t, s); len(g) != 1 || g[0].SMClockMHz != 1980 || g[0].ClockEventReasons != nil || g[0].Processes != nil {
		t.Errorf("with no state file: %+v, want one GPU at 1980 MHz, no reasons, no processes", g)
	}
	write := func(text string) {
		if err := os.WriteFile(state, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("uuid GPU-bench\npids 4242\nreasons 0x0\nsm_clock 1980\ntemp 61\n")
	g := devices(t, s)[0]
	if g.UUID != "GPU-bench" || g.SMClockMHz != 1980 || g.ClockEventReasons != nil || len(g.Processes) != 1 ||
		g.Processes[0].PID != 4242 || g.Processes[0].UsedMemory != 10<<30 || g.MemoryUsed != 10<<30 {
		t.Errorf("before the throttle: %+v", g)
	}
	write("uuid GPU-bench\npids 4242\nreasons 0x40\nsm_clock 990\ntemp 91\n")
	g = devices(t, s)[0]
	if g.SMClockMHz != 990 || g.TemperatureC != 91 || !reflect.DeepEqual(g.ClockEventReasons, []string{"hw_thermal_slowdown"}) {
		t.Errorf("throttled: SM %d MHz, %v C, reasons %v; want 990, 91, hw_thermal_slowdown", g.SMClockMHz, g.TemperatureC, g.ClockEventReasons)
	}
}
