// Package elfcheck reads what a Linux binary asks of the system it runs on:
// whether it is static, which shared libraries it loads, and the newest
// glibc symbol version it imports (its glibc floor). The packages declare
// these facts from the built binaries, never from a guess.
package elfcheck

import (
	"debug/elf"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MinGlibc is the oldest glibc heft declares even for a binary that names
// no glibc symbol version: RHEL/CentOS 7's, and the first release for arm64.
const MinGlibc = "2.17"

// Needs is what a binary needs from the system.
type Needs struct {
	Static     bool     // no program interpreter and no dynamic section: runs on any Linux
	Interp     string   // the program interpreter (dynamic loader), if any
	Libraries  []string // DT_NEEDED entries, in order
	GlibcFloor string   // the highest GLIBC_x.y version of an imported symbol; "" when none is versioned
}

// Read opens the ELF file at path and reports its needs.
func Read(path string) (Needs, error) {
	f, err := elf.Open(path)
	if err != nil {
		return Needs{}, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	var n Needs
	dynamic := false
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_DYNAMIC:
			dynamic = true
		case elf.PT_INTERP:
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return Needs{}, fmt.Errorf("read %s: interpreter: %w", path, err)
			}
			n.Interp = strings.TrimRight(string(b), "\x00")
		}
	}
	n.Static = !dynamic && n.Interp == ""
	if n.Static {
		return n, nil
	}
	if n.Libraries, err = f.ImportedLibraries(); err != nil {
		return Needs{}, fmt.Errorf("read %s: needed libraries: %w", path, err)
	}
	syms, err := f.ImportedSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return Needs{}, fmt.Errorf("read %s: imported symbols: %w", path, err)
	}
	for _, s := range syms {
		v, ok := strings.CutPrefix(s.Version, "GLIBC_")
		if !ok || !isVersion(v) {
			continue // unversioned, or GLIBC_PRIVATE
		}
		if n.GlibcFloor == "" || CompareGlibc(v, n.GlibcFloor) > 0 {
			n.GlibcFloor = v
		}
	}
	return n, nil
}

// DeclaredGlibc is the glibc version a package should require for this
// binary: its floor, and never below MinGlibc. "" for a static binary.
func (n Needs) DeclaredGlibc() string {
	if n.Static {
		return ""
	}
	if n.GlibcFloor == "" || CompareGlibc(n.GlibcFloor, MinGlibc) < 0 {
		return MinGlibc
	}
	return n.GlibcFloor
}

func isVersion(v string) bool {
	for part := range strings.SplitSeq(v, ".") {
		if _, err := strconv.Atoi(part); err != nil {
			return false
		}
	}
	return v != ""
}

// CompareGlibc orders two versions like "2.2.5" and "2.17" numerically,
// part by part: -1, 0 or +1. Parts that are not numbers count as 0.
func CompareGlibc(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}
