package bench

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The bench compiles its stand-in libnvidia-ml itself, finding go-nvml's
// nvml.h through the go command: area 11's throttle case once stopped on a
// machine whose module cache had never held go-nvml. The agent reading it
// through its binding is agent/gpu's TestBenchStandinNVML.
func TestBuildStandinNVML(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("the stand-in NVML needs gcc")
	}
	dir := t.TempDir()
	nv, err := buildStandinNVML(t.Context(), dir, "GPU-test")
	if err != nil {
		t.Fatal(err)
	}
	lib, err := elf.Open(filepath.Join(dir, "libnvidia-ml.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	syms, err := lib.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range syms {
		found = found || s.Name == "nvmlDeviceGetCurrentClocksEventReasons"
	}
	if lib.Type != elf.ET_DYN || !found {
		t.Fatalf("type %v, clock event reasons exported %v: want a shared library that exports them", lib.Type, found)
	}
	if err := nv.set(gpuState{pids: []int{42}, reasons: nvmlReasonHWThermalSlowdown, smMHz: 990, tempC: 91}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(nv.state)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"uuid GPU-test\n", "pids 42\n", "reasons 0x40\n", "sm_clock 990\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("state %q lacks %q", b, want)
		}
	}
}
