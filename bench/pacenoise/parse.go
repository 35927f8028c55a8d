package pacenoise

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Record is one stats line of an engine log.
type Record struct {
	Engine    string  // EngineVLLM or EngineSGLang
	V1        bool    // a vLLM V1 line ("Engine 000: …", "Waiting:")
	Time      float64 // seconds; vLLM lines without a container timestamp are read as UTC in the year 2000
	Running   int     // running requests at the log instant
	GenTPS    float64 // generated tokens per second over the interval
	PromptTPS float64 // prompt tokens per second over the interval (vLLM); SGLang decode lines carry none
	Seg       int     // excerpt number: "# --- …" comment lines separate non-contiguous excerpts
}

// Engines.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

var (
	// vLLM V0 (metrics.py / llm_engine.py) and V1 (loggers.py "Engine 000:")
	// stats lines, after any prefix: a container timestamp, "(APIServer
	// pid=N)", "INFO". Terminal-wrapped pastes end the match at "Running: N";
	// two records on one line (a paste cut by "$") are two matches.
	vllmRE = regexp.MustCompile(`(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.\d+)?[^\n]*?` +
		`Avg prompt throughput: ([\d.]+) tokens/s, ` +
		`Avg generation throughput: ([\d.]+) tokens/s, ` +
		`Running: (\d+)`)
	// A container runtime's ISO timestamp (ns) in front of a line.
	isoRE = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?Z`)
	// SGLang "Decode batch." (older) and "Decode batch," (newer) lines; the
	// bracket right before "Decode batch" holds the engine's own timestamp
	// (an outer collector timestamp in front of it is skipped).
	sglangRE = regexp.MustCompile(`\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})[^\]\[]*\]\s*` +
		`Decode batch[.,] #running-req: (\d+),.*?` +
		`gen throughput \(token/s\): ([\d.]+)`)
)

// ParseLine reads the stats records of one log line: none, one, or (for a
// paste that glued two vLLM lines together) several.
func ParseLine(line string) []Record {
	if m := sglangRE.FindStringSubmatch(line); m != nil {
		t, err := time.Parse(time.DateTime, m[1])
		r, err2 := strconv.Atoi(m[2])
		g, err3 := strconv.ParseFloat(m[3], 64)
		if err != nil || err2 != nil || err3 != nil {
			return nil
		}
		return []Record{{Engine: EngineSGLang, Time: float64(t.Unix()), Running: r, GenTPS: g}}
	}
	var recs []Record
	v1 := strings.Contains(line, "Engine 0") || strings.Contains(line, "Waiting:")
	iso, isoOK := isoTime(line)
	for _, m := range vllmRE.FindAllStringSubmatch(line, -1) {
		n := make([]int, 6)
		for i := range n {
			n[i], _ = strconv.Atoi(m[1+i])
		}
		p, err := strconv.ParseFloat(m[6], 64)
		g, err2 := strconv.ParseFloat(m[7], 64)
		r, err3 := strconv.Atoi(m[8])
		if err != nil || err2 != nil || err3 != nil {
			continue
		}
		t := iso
		if !isoOK {
			t = float64(time.Date(2000, time.Month(n[0]), n[1], n[2], n[3], n[4], 0, time.UTC).Unix())
		}
		recs = append(recs, Record{Engine: EngineVLLM, V1: v1, Time: t, Running: r, GenTPS: g, PromptTPS: p})
	}
	return recs
}

// isoTime is the container timestamp in front of line, if any.
func isoTime(line string) (float64, bool) {
	m := isoRE.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	t, err := time.Parse("2006-01-02T15:04:05", m[1])
	if err != nil {
		return 0, false
	}
	s := float64(t.Unix())
	if m[2] != "" {
		f, _ := strconv.ParseFloat("0."+m[2], 64)
		s += f
	}
	return s, true
}

// Source is one log file, parsed into intervals.
type Source struct {
	File    string
	URL     string // from the "# source:" line
	Engine  string // EngineVLLM or EngineSGLang ("" when no line matched)
	V1      bool   // vLLM V1
	Records []Record
	// Segments are runs of consecutive intervals: an excerpt, split again
	// where the timestamps jump.
	Segments [][]Interval
	// KHat is, per SGLang excerpt, the decode steps per log line the
	// timestamps imply (checks the default of 40).
	KHat []float64
}

// Interval is a record with the length of time it covers.
type Interval struct {
	Record
	DT float64 // seconds
}

// EngineName is the engine as a table shows it.
func (s *Source) EngineName() string {
	switch {
	case s.Engine == EngineSGLang:
		return "SGLang"
	case s.Engine == EngineVLLM && s.V1:
		return "vLLM V1"
	case s.Engine == EngineVLLM:
		return "vLLM V0"
	}
	return "unknown"
}

// Intervals is how many intervals s has.
func (s *Source) Intervals() int {
	n := 0
	for _, seg := range s.Segments {
		n += len(seg)
	}
	return n
}

// ReadDir parses every *.log file in dir, by name.
func ReadDir(dir string) ([]*Source, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.log files in %s", dir)
	}
	sort.Strings(files)
	var out []*Source
	for _, f := range files {
		s, err := ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// ReadFile parses one log file.
func ReadFile(path string) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(filepath.Base(path), f)
}

// Parse reads a log: stats lines, "# source:" and "# --- excerpt ---"
// comment lines; everything else is skipped.
func Parse(name string, r io.Reader) (*Source, error) {
	s := &Source{File: name}
	seg := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			switch {
			case strings.HasPrefix(line, "# source:"):
				s.URL, _, _ = strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "# source:")), " ")
			case strings.HasPrefix(line, "# ---"):
				seg++
			}
			continue
		}
		for _, rec := range ParseLine(line) {
			rec.Seg = seg
			s.Engine = rec.Engine
			s.V1 = s.V1 || rec.V1
			s.Records = append(s.Records, rec)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, recs := range bySegment(s.Records) {
		if s.Engine == EngineSGLang {
			s.Segments = append(s.Segments, s.sglangIntervals(recs)...)
		} else {
			s.Segments = append(s.Segments, s.vllmIntervals(recs)...)
		}
	}
	return s, nil
}

func bySegment(recs []Record) [][]Record {
	var out [][]Record
	for i, r := range recs {
		if i == 0 || r.Seg != recs[i-1].Seg {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], r)
	}
	return out
}

// vllmIntervals: an interval is the time since the previous line (1 s
// resolution, or the container's ns timestamp); the first line of an
// excerpt, and the first after a jump of more than 2.5 median spacings,
// gets the excerpt's median spacing.
func (s *Source) vllmIntervals(recs []Record) [][]Interval {
	var dts []float64
	for i := 1; i < len(recs); i++ {
		dts = append(dts, recs[i].Time-recs[i-1].Time)
	}
	med := 5.0
	switch {
	case len(dts) > 0:
		med = median(dts)
	case s.V1:
		med = 10
	}
	var out [][]Interval
	var cur []Interval
	for i, rec := range recs {
		dt := med
		if i > 0 {
			dt = rec.Time - recs[i-1].Time
			if dt <= 0 || dt > 2.5*med {
				if len(cur) > 0 {
					out = append(out, cur)
				}
				cur, dt = nil, med
			}
		}
		cur = append(cur, Interval{rec, dt})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// sglangIntervals: SGLang logs every K decode steps (--decode-log-interval,
// default 40) and its gen throughput is the tokens since the last line over
// the wall time, r tokens a step, so an interval lasts K·r/g. K is checked
// against the 1 s timestamps and replaced by their estimate when it is more
// than 30 % off.
func (s *Source) sglangIntervals(recs []Record) [][]Interval {
	k := float64(SGLangK)
	var usable []Record
	for _, r := range recs {
		if r.GenTPS > 0 {
			usable = append(usable, r)
		}
	}
	if len(usable) >= 3 && usable[len(usable)-1].Time > usable[0].Time {
		span := usable[len(usable)-1].Time - usable[0].Time
		steps := 0.0
		for _, r := range usable[1:] {
			steps += float64(r.Running) / r.GenTPS
		}
		if steps > 0 {
			kHat := span / steps
			s.KHat = append(s.KHat, kHat)
			if kHat < 0.7*SGLangK || kHat > 1.3*SGLangK {
				k = kHat
			}
		}
	}
	var out [][]Interval
	var cur []Interval
	for i, rec := range recs {
		dt := 0.0
		if rec.GenTPS > 0 {
			dt = k * float64(rec.Running) / rec.GenTPS
		}
		if i > 0 && rec.Time-recs[i-1].Time > max(5, 3*dt+2) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
		}
		cur = append(cur, Interval{rec, dt})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
