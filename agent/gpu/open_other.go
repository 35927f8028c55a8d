//go:build !darwin && !linux

package gpu

import (
	"runtime"

	"github.com/hashicorp/go-hclog"
)

// Open returns a Source with no devices and an error that says why: GPU
// facts are read on Linux (NVML) and macOS only.
func Open(logger hclog.Logger) (Source, error) {
	return emptySource{}, unavailable("GPU facts are read on linux (NVML) and darwin only, not on "+runtime.GOOS, nil)
}
