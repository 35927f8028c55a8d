package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries the bench runs, by file name, with their packages.
var binaries = map[string]string{
	"heft-agent":       "./agent/cmd/heft-agent",
	"heft-coordinator": "./coordinator/cmd/heft-coordinator",
	"heft-sim":         "./sim/cmd/heft-sim",
	"heft-sync":        "./gateway/cmd/heft-sync",
	"swarm":            "./bench/cmd/swarm",
	"heftbench":        "./bench/cmd/heftbench",
}

// ModuleRoot finds the heft module's root by walking up from dir.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if strings.TrimSpace(line) == "module heft" {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the heft module (no go.mod with \"module heft\" above here)")
		}
		dir = parent
	}
}

// Build compiles every binary the bench runs into dir.
func Build(ctx context.Context, root, dir string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, pkg := range binaries {
		args = append(args, pkg)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// binPath is a binary in dir, checked to exist.
func binPath(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("binary %s not found in %s (build it, or run scripts/bench.sh): %w", name, dir, err)
	}
	return p, nil
}
