//go:build darwin

package gpu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/host"
	"heft/shared/wire"
)

const powermetricsPath = "/usr/bin/powermetrics"

// Open returns a Source for the integrated GPU of an Apple silicon Mac.
// Memory is the host's unified memory; frequency, utilisation and power
// come from powermetrics, which only root may run: as another user the
// Source reports the rest and the error says what is missing.
func Open(logger hclog.Logger) (Source, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = logger.Named("gpu")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := host.Collect(ctx)
	if !h.UnifiedMemory {
		return emptySource{}, unavailable("only Apple silicon GPUs are reported on a Mac", err)
	}
	s := &appleSource{logger: logger.Named("powermetrics"), root: os.Geteuid() == 0}
	if !s.root {
		return s, unavailable("powermetrics needs root, so GPU frequency, utilisation and power are unknown (run the agent as root to read them)", nil)
	}
	return s, nil
}

type appleSource struct {
	logger hclog.Logger
	root   bool
	closed atomic.Bool
}

func (s *appleSource) Devices(ctx context.Context) ([]wire.GPU, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	h, err := host.Collect(ctx)
	if err != nil {
		s.logger.Debug("host facts incomplete", "error", err)
	}
	var (
		pm    *PowermetricsGPU
		pmErr error
	)
	if s.root {
		var p PowermetricsGPU
		if p, pmErr = runPowermetrics(ctx); pmErr == nil {
			pm = &p
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return []wire.GPU{appleGPU(h, pm, pmErr)}, nil
}

// runPowermetrics takes one GPU sample; it lasts about a second.
func runPowermetrics(ctx context.Context) (PowermetricsGPU, error) {
	cmd := exec.CommandContext(ctx, powermetricsPath, "--samplers", "gpu_power", "-i", "1000", "-n", "1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 512 {
			msg = msg[:512]
		}
		if msg != "" {
			return PowermetricsGPU{}, fmt.Errorf("%s: %w: %s", powermetricsPath, err, msg)
		}
		return PowermetricsGPU{}, fmt.Errorf("%s: %w", powermetricsPath, err)
	}
	return ParsePowermetrics(bytes.NewReader(out))
}

func (s *appleSource) Close() error {
	s.closed.Store(true)
	return nil
}
