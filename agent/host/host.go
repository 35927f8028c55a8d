// Package host reads facts about the machine the agent runs on through
// gopsutil. Every call takes the context, so tests can point gopsutil at a
// fake /proc with common.EnvMap{common.HostProcEnvKey: dir}.
package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/shirou/gopsutil/v4/cpu"
	gohost "github.com/shirou/gopsutil/v4/host"
	"github.com/shirou/gopsutil/v4/mem"

	"heft/shared/wire"
)

// Collect returns this host's facts. Each fact is read on its own: when
// some cannot be read, the others are still filled in and the error joins
// what failed. OS and Arch are always set.
func Collect(ctx context.Context) (wire.Host, error) {
	h := wire.Host{OS: runtime.GOOS, Arch: runtime.GOARCH}
	var errs []error
	fail := func(what string, err error) { errs = append(errs, fmt.Errorf("%s: %w", what, err)) }

	// gopsutil's host.Info fails whole when any of its many parts does
	// (boot time, host ID, ...), so read the parts needed one by one.
	if name, err := os.Hostname(); err == nil {
		h.Hostname = name
	} else {
		fail("hostname", err)
	}
	if platform, _, version, err := gohost.PlatformInformationWithContext(ctx); err == nil {
		h.Platform, h.PlatformVersion = platform, version
	} else {
		fail("platform", err)
	}
	if kernel, err := gohost.KernelVersionWithContext(ctx); err == nil {
		h.KernelVersion = kernel
	} else {
		fail("kernel version", err)
	}
	kernelArch, _ := gohost.KernelArch()
	// Every Apple silicon Mac shares its memory with the GPU.
	h.UnifiedMemory = runtime.GOOS == "darwin" && (runtime.GOARCH == "arm64" || kernelArch == "arm64")

	if infos, err := cpu.InfoWithContext(ctx); err == nil && len(infos) > 0 {
		h.CPUModel = strings.TrimSpace(infos[0].ModelName)
	} else if err != nil {
		fail("cpu model", err)
	}
	if n, err := cpu.CountsWithContext(ctx, true); err == nil && n > 0 {
		h.CPUCores = n
	} else {
		if err == nil {
			err = errors.New("no cpus found")
		}
		fail("cpu count", err)
	}
	if vm, err := mem.VirtualMemoryWithContext(ctx); err == nil {
		h.MemoryTotal, h.MemoryAvailable = vm.Total, vm.Available
	} else {
		fail("memory", err)
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return h, fmt.Errorf("host facts: %w", errors.Join(errs...))
	}
	return h, nil
}
