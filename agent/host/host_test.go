package host

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"heft/shared/testutil"

	"github.com/shirou/gopsutil/v4/common"
)

// repoTestdata is a path under testdata/ at the repository root.
func repoTestdata(t testing.TB, parts ...string) string {
	return filepath.Join(append([]string{testutil.RepoRoot(t), "testdata"}, parts...)...)
}

func TestCollectThisHost(t *testing.T) {
	h, err := Collect(context.Background())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if h.Hostname == "" || h.OS != runtime.GOOS || h.Arch != runtime.GOARCH {
		t.Errorf("identity: %+v", h)
	}
	if h.CPUCores < 1 {
		t.Errorf("CPUCores = %d, want ≥ 1", h.CPUCores)
	}
	if h.MemoryTotal == 0 || h.MemoryAvailable > h.MemoryTotal {
		t.Errorf("memory total %d, available %d", h.MemoryTotal, h.MemoryAvailable)
	}
	if h.KernelVersion == "" {
		t.Error("KernelVersion is empty")
	}
	if want := runtime.GOOS == "darwin" && runtime.GOARCH == "arm64"; want && !h.UnifiedMemory {
		t.Error("UnifiedMemory false on Apple silicon")
	}
	if runtime.GOOS != "darwin" && h.UnifiedMemory {
		t.Error("UnifiedMemory true off a Mac")
	}
	if err := h.Validate(); err != nil {
		t.Errorf("wire validation: %v", err)
	}
	t.Logf("%+v", h)
}

func fakeRoots(proc, etc string) context.Context {
	return context.WithValue(context.Background(), common.EnvKey, common.EnvMap{
		common.HostProcEnvKey: proc,
		common.HostEtcEnvKey:  etc,
		common.HostSysEnvKey:  filepath.Join(proc, "no-sys"),
	})
}

func TestCollectFakeProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("gopsutil reads /proc only on linux")
	}
	etc := t.TempDir()
	osRelease := "NAME=\"Ubuntu\"\nID=ubuntu\nVERSION_ID=\"24.04\"\n"
	if err := os.WriteFile(filepath.Join(etc, "os-release"), []byte(osRelease), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Collect(fakeRoots(repoTestdata(t, "proc", "gpu-host"), etc))
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if h.MemoryTotal != 2113645052*1024 || h.MemoryAvailable != 1987364120*1024 {
		t.Errorf("memory total %d, available %d: not the fixture's", h.MemoryTotal, h.MemoryAvailable)
	}
	if h.CPUModel != "AMD EPYC 9654 96-Core Processor" || h.CPUCores != 4 {
		t.Errorf("cpu %q × %d, want the fixture's", h.CPUModel, h.CPUCores)
	}
	if h.Platform != "ubuntu" || h.PlatformVersion != "24.04" {
		t.Errorf("platform %q %q, want ubuntu 24.04", h.Platform, h.PlatformVersion)
	}
}

// An empty /proc fails memory and CPU, yet the rest still comes back.
func TestCollectPartialFailure(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("gopsutil reads /proc only on linux")
	}
	empty := t.TempDir()
	h, err := Collect(fakeRoots(empty, empty))
	if err == nil {
		t.Fatal("Collect succeeded over an empty /proc")
	}
	for _, part := range []string{"memory", "cpu count", "cpu model"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %q", err, part)
		}
	}
	if h.Hostname == "" || h.OS != "linux" || h.Arch != runtime.GOARCH || h.KernelVersion == "" {
		t.Errorf("facts that need no /proc are missing: %+v", h)
	}
	if h.MemoryTotal != 0 || h.CPUCores != 0 {
		t.Errorf("invented values: %+v", h)
	}
}

func BenchmarkCollect(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		if _, err := Collect(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
