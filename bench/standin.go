package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// standinSource is a stand-in libnvidia-ml with one GPU whose state the
// bench sets (nvml/standin.c says how).
//
//go:embed nvml/standin.c
var standinSource []byte

// standinNVML is the stand-in library built into a folder, and the state
// file it reads on every query. An agent started with its env loads it
// through its own NVML binding, as it would a driver's.
type standinNVML struct {
	dir, state, uuid string
}

// gpuState is what the stand-in GPU reports.
type gpuState struct {
	pids    []int
	reasons uint64 // NVML clock event reason bits
	smMHz   int    // of 1980
	tempC   int
}

const (
	// nvmlReasonHWThermalSlowdown is nvml.h's clock event reason bit.
	nvmlReasonHWThermalSlowdown = 0x40
	// standinMaxSM is the stand-in GPU's max SM clock, MHz (MAX_SM).
	standinMaxSM = 1980
)

// buildStandinNVML compiles the stand-in with gcc against go-nvml's nvml.h
// (found through the go command in the heft module) into dir.
func buildStandinNVML(ctx context.Context, dir, uuid string) (*standinNVML, error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return nil, fmt.Errorf("the stand-in NVML needs gcc: %w", err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root, err := ModuleRoot(wd)
	if err != nil {
		return nil, fmt.Errorf("the stand-in NVML is compiled against go-nvml's nvml.h, found from the heft module: %w", err)
	}
	// go mod download, not go list -m: on a machine whose module cache has
	// never held go-nvml (the binaries do not need its C header), go list
	// prints an empty folder.
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/NVIDIA/go-nvml")
	dl.Dir = root
	out, err := dl.Output()
	if err != nil {
		return nil, fmt.Errorf("find go-nvml's nvml.h: go mod download: %w", err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return nil, fmt.Errorf("find go-nvml's nvml.h: go mod download gave no folder (%v %s)", err, mod.Error)
	}
	header := filepath.Join(mod.Dir, "pkg", "nvml")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	src := filepath.Join(dir, "standin.c")
	if err := os.WriteFile(src, standinSource, 0o600); err != nil {
		return nil, err
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	gcc := exec.CommandContext(ctx, cc, "-Wall", "-Werror", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", header,
		"-shared", "-fPIC", "-o", lib, src)
	if b, err := gcc.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("compile the stand-in NVML: %w: %s", err, b)
	}
	return &standinNVML{dir: dir, state: filepath.Join(dir, "state"), uuid: uuid}, nil
}

// env is what an agent's environment needs to load the stand-in.
func (s *standinNVML) env() []string {
	return []string{"LD_LIBRARY_PATH=" + s.dir, "HEFT_STANDIN_NVML_STATE=" + s.state}
}

// set replaces the GPU's state at once (a rename), so no query reads half
// of it.
func (s *standinNVML) set(g gpuState) error {
	var b strings.Builder
	fmt.Fprintf(&b, "uuid %s\n", s.uuid)
	if len(g.pids) > 0 {
		b.WriteString("pids")
		for _, p := range g.pids {
			b.WriteString(" " + strconv.Itoa(p))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "reasons %#x\nsm_clock %d\ntemp %d\n", g.reasons, g.smMHz, g.tempC)
	tmp := s.state + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.state)
}
