package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"heft/shared/testutil"
)

// section is one "## N. Title" block of a report, with its table.
type parsedSection struct {
	title   string
	columns []string
	rows    [][]string
	text    string
}

var sectionRe = regexp.MustCompile(`^## (\d)\. (.+)$`)

// parseReport splits a report into its sections and their tables.
func parseReport(t *testing.T, md string) map[int]*parsedSection {
	t.Helper()
	out := map[int]*parsedSection{}
	var cur *parsedSection
	for _, line := range strings.Split(md, "\n") {
		if m := sectionRe.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			cur = &parsedSection{title: m[2]}
			out[n] = cur
			continue
		}
		if cur == nil {
			continue
		}
		cur.text += line + "\n"
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
		switch {
		case cur.columns == nil:
			cur.columns = cells
		case strings.HasPrefix(line, "| ---"):
		default:
			if len(cells) != len(cur.columns) {
				t.Errorf("section %q: row %q has %d cells, the table %d columns", cur.title, line, len(cells), len(cur.columns))
			}
			cur.rows = append(cur.rows, cells)
		}
	}
	return out
}

// number reads a table cell's leading number, e.g. "1,069 (1,062–1,071)" → 1069.
func number(cell string) (float64, bool) {
	f := strings.Fields(strings.ReplaceAll(cell, ",", ""))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.Replace(f[0], "−", "-", 1), 64)
	return v, err == nil
}

// testBin is the binaries every test of the package runs, built once.
var testBin struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m, goleak.Cleanup(func(code int) {
		if testBin.dir != "" {
			os.RemoveAll(testBin.dir)
		}
		os.Exit(code)
	}))
}

// testBinaries builds the bench's binaries once for the package's tests.
func testBinaries(t *testing.T) string {
	t.Helper()
	testBin.once.Do(func() {
		root, err := ModuleRoot(".")
		if err != nil {
			testBin.err = err
			return
		}
		if testBin.dir, testBin.err = os.MkdirTemp("", "heft-bench-test-bin-"); testBin.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		testBin.err = Build(ctx, root, testBin.dir)
	})
	if testBin.err != nil {
		t.Fatal(testBin.err)
	}
	return testBin.dir
}

// TestQuickRun builds the binaries and runs `heftbench --quick` as
// scripts/bench.sh would, with 50 agents: every area must produce its
// table, with numbers where numbers belong. Speeds are not judged here.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five binaries and runs the quick bench (about 20 s)")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("the bench reads /proc: Linux only")
	}
	t.Parallel() // judges no speed, so it overlaps TestRoutingShort
	bin := testBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results", "latest.md")
	var stdout, stderr bytes.Buffer
	// Area 9 needs haproxy and nginx, and has its own test (TestRoutingShort).
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "heftbench"), "--quick", "--areas", "1,2,3,4,5,6,7,8", "--agents", "50",
		"--bin", bin, "--out", out)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("heftbench --quick: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(data)
	for _, want := range []string{"# heft benchmark results", "- machine: ", "- CPU: ", "- Go: go", "- commit: ", "- mode: quick", "Total elapsed: "} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	secs := parseReport(t, md)
	titles := map[int]string{1: "Probe fidelity", 2: "Cold-start immunity", 3: "Probe cost", 4: "Weight accuracy",
		5: "Coordinator scale", 6: "Agent footprint", 7: "Prefill fidelity", 8: "Prefill probe cost"}
	for n, title := range titles {
		s := secs[n]
		if s == nil {
			t.Errorf("no section %d (%s)", n, title)
			continue
		}
		if s.title != title {
			t.Errorf("section %d is %q, want %q", n, s.title, title)
		}
		if len(s.rows) == 0 {
			t.Errorf("section %d has no table rows:\n%s", n, s.text)
		}
		if strings.Contains(s.text, "**not finished**") {
			t.Errorf("section %d did not finish:\n%s", n, s.text)
		}
		if s.columns[len(s.columns)-1] != "verdict" {
			t.Errorf("section %d: last column %q, want verdict", n, s.columns[len(s.columns)-1])
		}
		// The file and stdout carry the same tables.
		if tb := tableText(s.text); !strings.Contains(stdout.String(), tb) {
			t.Errorf("section %d's table is not on stdout as in the file", n)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Numbers where numbers belong: the harness measured, whatever the speed.
	col := func(s *parsedSection, name string) int {
		for i, c := range s.columns {
			if c == name {
				return i
			}
		}
		t.Fatalf("section %q has no column %q: %v", s.title, name, s.columns)
		return -1
	}
	positive := func(area int, column string) {
		s := secs[area]
		i := col(s, column)
		for _, r := range s.rows {
			if v, ok := number(r[i]); !ok || v <= 0 {
				t.Errorf("area %d, %s, %q: %q is not a measured positive number", area, r[0], column, r[i])
			}
		}
	}
	positive(1, "true capacity tok/s")
	positive(1, "measured tok/s")
	positive(2, "warm probe tok/s")
	positive(2, "cold-start probe tok/s")
	positive(3, "probe wall s")
	positive(4, "heft weight")
	positive(4, "ready → admitted s")
	positive(8, "prefill adds s")
	positive(8, "measured prefill burst s")
	prefill := secs[7]
	for _, r := range prefill.rows {
		if r[0] == "ranking" {
			if !strings.Contains(r[1], "decode weight: ") || !strings.Contains(r[3], "prefill weight: ") {
				t.Errorf("area 7 ranking row %q", r)
			}
			continue
		}
		for _, c := range []string{"true prefill tok/s", "measured prefill tok/s", "decode weight", "prefill weight"} {
			if v, ok := number(r[col(prefill, c)]); !ok || v <= 0 {
				t.Errorf("area 7, %s, %q: %q is not a measured positive number", r[0], c, r[col(prefill, c)])
			}
		}
	}
	if len(prefill.rows) != 3 {
		t.Errorf("quick mode: %d prefill rows, want two calibrations and the ranking", len(prefill.rows))
	}
	if len(secs[1].rows) != 2 || len(secs[4].rows) != 3 {
		t.Errorf("quick mode: %d fidelity workers and %d weighted workers, want 2 and 3", len(secs[1].rows), len(secs[4].rows))
	}
	scale := secs[5]
	if scale.columns[1] != "50 agents" {
		t.Errorf("area 5 columns %v, want a 50 agents column", scale.columns)
	}
	for _, r := range scale.rows {
		if strings.HasPrefix(r[0], "coordinator peak RSS") || strings.HasPrefix(r[0], "snapshot → visible, p99") ||
			strings.HasPrefix(r[0], "weight recompute") {
			if v, ok := number(r[1]); !ok || v <= 0 {
				t.Errorf("area 5: %q = %q, not measured", r[0], r[1])
			}
		}
	}
	for _, r := range secs[6].rows {
		if strings.HasPrefix(r[0], "agent RSS") || strings.HasPrefix(r[0], "log follow: lines/s") {
			if v, ok := number(r[1]); !ok || v <= 0 {
				t.Errorf("area 6: %q = %q, not measured", r[0], r[1])
			}
		}
	}
}

// tableText is the markdown table inside a section's text.
func tableText(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "|") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func TestRunRejectsBadOptions(t *testing.T) {
	if _, err := Run(context.Background(), Options{Areas: []int{12}, Bin: t.TempDir()}); err == nil ||
		!strings.Contains(err.Error(), "unknown area 12 (areas are 1 to 11)") {
		t.Errorf("area 12: err = %v", err)
	}
	if _, err := Run(context.Background(), Options{}); err == nil {
		t.Error("no binaries folder: want an error")
	}
}
