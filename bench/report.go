package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Table is one markdown table.
type Table struct {
	Caption string // a bold line above the table; "" = none
	Columns []string
	Rows    [][]string
}

// Add appends a row; missing cells are left empty.
func (t *Table) Add(cells ...string) {
	row := make([]string, len(t.Columns))
	copy(row, cells)
	t.Rows = append(t.Rows, row)
}

// Markdown renders the table.
func (t *Table) Markdown() string {
	var b strings.Builder
	if t.Caption != "" {
		b.WriteString("**" + t.Caption + "**\n\n")
	}
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" ")
			b.WriteString(strings.ReplaceAll(c, "|", `\|`))
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}
	line(t.Columns)
	sep := make([]string, len(t.Columns))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range t.Rows {
		line(r)
	}
	return b.String()
}

// Section is one area's result.
type Section struct {
	Area    int
	Title   string
	Intro   string // one line: what was measured and how
	Table   Table
	More    []Table // further tables, after the first
	Notes   []string
	Elapsed time.Duration
	Err     error // the area could not finish; the table holds what it got
}

// Markdown renders the section.
func (s *Section) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %d. %s\n\n", s.Area, s.Title)
	if s.Intro != "" {
		b.WriteString(s.Intro + "\n\n")
	}
	for _, t := range append([]Table{s.Table}, s.More...) {
		if len(t.Rows) > 0 {
			b.WriteString(t.Markdown())
			b.WriteString("\n")
		}
	}
	for _, n := range s.Notes {
		b.WriteString("- " + n + "\n")
	}
	if s.Err != nil {
		fmt.Fprintf(&b, "- **not finished**: %v\n", s.Err)
	}
	fmt.Fprintf(&b, "- elapsed: %s\n\n", s.Elapsed.Round(time.Second))
	return b.String()
}

// Header describes where and when the numbers were taken.
type Header struct {
	Date      time.Time
	Machine   string
	CPU       string
	Cores     int
	GoVersion string
	Commit    string
	LoadAvg   string
	Mode      string
}

// Markdown renders the header.
func (h Header) Markdown() string {
	var b strings.Builder
	b.WriteString("# heft benchmark results\n\n")
	fmt.Fprintf(&b, "- date: %s\n", h.Date.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "- machine: `%s`\n", h.Machine)
	fmt.Fprintf(&b, "- CPU: %s, %d cores\n", h.CPU, h.Cores)
	fmt.Fprintf(&b, "- Go: %s\n", h.GoVersion)
	fmt.Fprintf(&b, "- commit: %s\n", h.Commit)
	fmt.Fprintf(&b, "- load average at start: %s\n", h.LoadAvg)
	fmt.Fprintf(&b, "- mode: %s\n\n", h.Mode)
	return b.String()
}

// machineHeader gathers the header from this machine. Nothing here fails:
// what cannot be read is "unknown".
func machineHeader(ctx context.Context, mode string) Header {
	h := Header{Date: time.Now(), Cores: runtime.NumCPU(), GoVersion: runtime.Version(), Mode: mode,
		Machine: runtime.GOOS + "/" + runtime.GOARCH, CPU: "unknown", Commit: "unknown", LoadAvg: "unknown"}
	if out, err := command(ctx, "uname", "-a"); err == nil {
		h.Machine = out
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	} else if out, err := command(ctx, "sysctl", "-n", "machdep.cpu.brand_string"); err == nil {
		h.CPU = out
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			h.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	// Read-only git: --no-optional-locks keeps status from touching the index.
	if out, err := command(ctx, "git", "--no-optional-locks", "rev-parse", "--short=12", "HEAD"); err == nil {
		h.Commit = out
		if st, err := command(ctx, "git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
			h.Commit += " (with uncommitted changes)"
		}
	}
	return h
}

func command(ctx context.Context, name string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, name, args...).Output()
	return strings.TrimSpace(string(out)), err
}

// Report is the whole result.
type Report struct {
	Header   Header
	Sections []*Section
	Elapsed  time.Duration
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString(r.Header.Markdown())
	for _, s := range r.Sections {
		b.WriteString(s.Markdown())
	}
	fmt.Fprintf(&b, "Total elapsed: %s.\n", r.Elapsed.Round(time.Second))
	return b.String()
}

// write renders to w, ignoring a nil w.
func write(w io.Writer, s string) {
	if w != nil {
		_, _ = io.WriteString(w, s)
	}
}
