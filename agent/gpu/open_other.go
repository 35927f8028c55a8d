//go:build !darwin && !(linux && cgo)

package gpu

import (
	"runtime"

	"github.com/hashicorp/go-hclog"
)

// Open returns a Source with no devices and an error that says why: go-nvml
// needs cgo, and only Linux and macOS are supported.
func Open(logger hclog.Logger) (Source, error) {
	if runtime.GOOS == "linux" {
		return emptySource{}, unavailable("this agent was built without cgo and cannot load NVML (build it with CGO_ENABLED=1)", nil)
	}
	return emptySource{}, unavailable("GPU facts are read on linux (NVML) and darwin only, not on "+runtime.GOOS, nil)
}
