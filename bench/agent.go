package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/logfollow"
	"heft/shared/wire"
	"heft/sim"
)

// FollowLogCommand is heftbench's hidden subcommand for area 6's log
// benchmark: a separate process, so its memory can be read from /proc.
const FollowLogCommand = "follow-log"

// endMarker is the last line the log benchmark appends.
const endMarker = "HEFT-BENCH-END"

// footprintWorker is the engine the agent sits beside in area 6.
var footprintWorker = Calibration{Name: "agent-footprint", Flavor: sim.FlavorVLLM, SingleTPS: 100, Batch16TPS: 1200}

// agentParams are area 6's sampling window and log growth.
func (e *env) agentParams() (time.Duration, int64) {
	window, logBytes := 60*time.Second, int64(1_000_000_000)
	if e.opts.Quick {
		window, logBytes = 3*time.Second, 20_000_000
	}
	if e.opts.AgentWindow > 0 {
		window = e.opts.AgentWindow
	}
	if e.opts.LogBytes > 0 {
		logBytes = e.opts.LogBytes
	}
	return window, logBytes
}

func (e *env) areaAgent(ctx context.Context) *Section {
	window, logBytes := e.agentParams()
	s := &Section{
		Title: "Agent footprint",
		Intro: fmt.Sprintf("heft-agent run beside one heft-sim (%s), reporting to a heft-coordinator: once its worker is admitted "+
			"(the probe's two bursts are over), its RSS and CPU are sampled from /proc every second for %s. Then a separate "+
			"process follows a vLLM log with heft/agent/logfollow and feeds every line to enginelog's tracker, as the agent "+
			"does, while %s MB are appended to it.", footprintWorker, window, num(float64(logBytes)/mb, 0)),
		Table: Table{Columns: []string{"metric", "measured", "target", "verdict"}},
	}
	u, hwm, err := e.agentFootprint(ctx, window)
	if err != nil {
		s.Notes = append(s.Notes, "agent run: "+err.Error())
	}
	steadyMB := Summary{N: u.RSS.N, Median: u.RSS.Median / mb, Min: u.RSS.Min / mb, Max: u.RSS.Max / mb}
	for _, v := range u.RSS.Values {
		steadyMB.Values = append(steadyMB.Values, v/mb)
	}
	if err != nil {
		steadyMB = Summary{}
	}
	s.Table.Add("agent RSS while idle, MB (median, min–max of samples)", steadyMB.Format(1), "< 30 MB",
		atMost(steadyMB, 30, 1, " MB"))
	hwmMB := math.NaN()
	if err == nil {
		hwmMB = float64(hwm) / mb
	}
	s.Table.Add("agent peak RSS (VmHWM, probe included), MB", num(hwmMB, 1), "", Info)
	cpu := Summary{}
	if err == nil {
		cpu = Summarize([]float64{u.CPUPercent})
	}
	s.Table.Add(fmt.Sprintf("agent CPU over %s, %% of a core", window), cpu.Format(3), "< 0.5 %", atMost(cpu, 0.5, 3, " pp"))

	lf, err := e.logFollow(ctx, logBytes)
	if err != nil {
		s.Notes = append(s.Notes, "log follow: "+err.Error())
		s.Table.Add("log follow: lines/s", "n/a", "", "miss: not measured")
		return s
	}
	s.Table.Add(fmt.Sprintf("log follow: lines/s (%s lines, %s MB)", num(float64(lf.lines), 0), num(float64(logBytes)/mb, 0)),
		num(lf.rate, 0), "", Info)
	s.Table.Add("log follow: MB/s", num(float64(logBytes)/mb/lf.seconds, 1), "", Info)
	flat := Pass
	if lf.growthMB > 5 {
		flat = fmt.Sprintf("miss: grew %s MB", num(lf.growthMB, 1))
	}
	s.Table.Add("log follow: RSS after 10 % of the time / max / at the end, MB",
		fmt.Sprintf("%s / %s / %s", num(lf.early, 1), num(lf.max, 1), num(lf.end, 1)), "flat (< 5 MB growth)", flat)
	s.Table.Add("log follow: CPU, % of a core", num(lf.cpu, 0), "", Info)
	if !lf.facts {
		s.Notes = append(s.Notes, "the tracker found no KV pools in the followed log: the lines were not parsed as the agent would")
	}
	return s
}

// agentFootprint runs coordinator + sim + agent, waits for the worker to be
// admitted, then samples the agent.
func (e *env) agentFootprint(ctx context.Context, window time.Duration) (Usage, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, window+3*time.Minute)
	defer cancel()
	dir := filepath.Join(e.work, "agent")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Usage{}, 0, err
	}
	co, err := e.startCoordinator(rctx, "agent-coordinator")
	if err != nil {
		return Usage{}, 0, err
	}
	procs := []*child{co.child}
	defer func() { stopAll(procs) }()
	sp, err := e.startSimProc(dir, footprintWorker.Name, footprintWorker, 0)
	if err != nil {
		return Usage{}, 0, err
	}
	procs = append(procs, sp.child)
	ag, err := e.startAgent(dir, "bench-footprint", co, footprintWorker.Flavor, sp, true)
	if err != nil {
		return Usage{}, 0, err
	}
	procs = append(procs, ag)
	e.logf("agent footprint: waiting for the worker to be admitted")
	for {
		list, _ := co.workers(rctx)
		admitted := false
		for _, w := range list {
			admitted = admitted || samePort(w.URL, sp.url) && w.State == "admitted"
		}
		if admitted {
			break
		}
		if !ag.Alive() {
			return Usage{}, 0, fmt.Errorf("heft-agent exited%s", ag.stderrTail())
		}
		if rctx.Err() != nil {
			return Usage{}, 0, fmt.Errorf("worker not admitted in time: %s", describeWorkers(list))
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.logf("agent footprint: sampling the agent for %s", window)
	smp, err := startSampler(ag.Pid(), time.Second)
	if err != nil {
		return Usage{}, 0, err
	}
	select {
	case <-rctx.Done():
	case <-time.After(window):
	}
	u, err := smp.Stop()
	if err == nil && !ag.Alive() {
		err = fmt.Errorf("heft-agent exited during the window%s", ag.stderrTail())
	}
	return u, u.HWM, err
}

// logFollowResult is what the log benchmark saw.
type logFollowResult struct {
	lines           int64
	seconds, rate   float64
	early, max, end float64 // RSS, MB
	growthMB        float64
	cpu             float64
	facts           bool
}

// followReport is the follow-log child's last line.
type followReport struct {
	Lines   int64   `json:"lines"`
	Seconds float64 `json:"seconds"`
	Pools   int     `json:"pools"`
}

// logFollow appends logBytes of vLLM log lines to a file a follow-log
// child follows, sampling the child's memory as it goes.
func (e *env) logFollow(ctx context.Context, logBytes int64) (logFollowResult, error) {
	var r logFollowResult
	self, err := binPath(e.bin, "heftbench")
	if err != nil {
		return r, err
	}
	dir := filepath.Join(e.work, "logfollow")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return r, err
	}
	logPath := filepath.Join(dir, "vllm.log")
	// A real start-up log first (the sim writes vLLM's lines), so the
	// tracker has pools to keep while the log grows.
	srv, err := sim.Start(sim.Config{Flavor: sim.FlavorVLLM, Model: benchModel, SingleTPS: 100, Batch16TPS: 1200,
		DP: 2, LogPath: logPath}, "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	srv.Close()
	defer os.Remove(logPath)

	ch, err := startChild(dir, "follow-log", self, []string{FollowLogCommand, "--path", logPath}, childIO{Lines: true})
	if err != nil {
		return r, err
	}
	defer ch.Stop(5 * time.Second)
	if line, err := ch.Line(ctx, 30*time.Second); err != nil || line != "following" {
		return r, fmt.Errorf("follow-log did not start: %q %v", line, err)
	}
	smp, err := startSampler(ch.Pid(), 250*time.Millisecond)
	if err != nil {
		return r, err
	}
	e.logf("agent footprint: appending %s MB to a followed log", num(float64(logBytes)/mb, 0))
	start := time.Now()
	werr := appendLog(logPath, logBytes)
	line, err := ch.Line(ctx, 10*time.Minute)
	u, _ := smp.Stop()
	if werr != nil {
		return r, werr
	}
	if err != nil {
		return r, err
	}
	var rep followReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		return r, fmt.Errorf("follow-log printed %q: %w", line, err)
	}
	elapsed := time.Since(start)
	r.lines, r.seconds = rep.Lines, rep.Seconds
	if r.seconds > 0 {
		r.rate = float64(rep.Lines) / rep.Seconds
	}
	r.facts = rep.Pools > 0
	if w := u.Window.Seconds(); w > 0 {
		r.cpu = u.CPUPercent
	}
	samples := u.Samples
	// RSS once the follower is running at full tilt (10 % of the time in),
	// then its largest and its last value.
	from := len(samples) / 10
	if from >= len(samples) {
		return r, fmt.Errorf("too few memory samples over %s", elapsed)
	}
	r.early, r.end = samples[from]/mb, samples[len(samples)-1]/mb
	for _, v := range samples[from:] {
		r.max = math.Max(r.max, v/mb)
	}
	r.growthMB = r.max - r.early
	return r, nil
}

// appendLog appends about n bytes of a busy vLLM server's log lines to
// path (request lines and the periodic load line), then the end marker.
func appendLog(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var written int64
	var buf []byte
	for i := 0; written < n; i++ {
		buf = buf[:0]
		if i%20 == 19 {
			buf = append(buf, "(APIServer pid=1) INFO 03-02 10:01:10 [loggers.py:259] Engine 000: Avg prompt throughput: "...)
			buf = strconv.AppendFloat(buf, float64(i%997)/10, 'f', 1, 64)
			buf = append(buf, " tokens/s, Avg generation throughput: "...)
			buf = strconv.AppendFloat(buf, float64(i%2503)/2, 'f', 1, 64)
			buf = append(buf, " tokens/s, Running: "...)
			buf = strconv.AppendInt(buf, int64(i%17), 10)
			buf = append(buf, " reqs, Waiting: 0 reqs, GPU KV cache usage: "...)
			buf = strconv.AppendFloat(buf, float64(i%1000)/10, 'f', 1, 64)
			buf = append(buf, "%, Prefix cache hit rate: 0.0%\n"...)
		} else {
			buf = append(buf, "(APIServer pid=1) INFO:     127.0.0.1:"...)
			buf = strconv.AppendInt(buf, int64(30000+i%30000), 10)
			buf = append(buf, " - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			f.Close()
			return err
		}
		written += int64(len(buf))
	}
	if _, err := w.WriteString(endMarker + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FollowLogMain is the follow-log child: it prints "following", follows
// --path from its start, feeding every line to a vLLM tracker, and on the
// end marker prints a JSON report and exits.
func FollowLogMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(FollowLogCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("path", "", "log file to follow")
	if err := fs.Parse(args); err != nil || *path == "" {
		fmt.Fprintln(stderr, "usage: heftbench follow-log --path FILE")
		return 2
	}
	g, err := engine.LogGrammar(wire.EngineVLLM)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	tr := enginelog.NewTracker(g)
	fmt.Fprintln(stdout, "following")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lines int64
	var first, last time.Time
	done := false
	err = logfollow.Follow(ctx, *path, logfollow.Options{OnReset: func(string) { tr.Reset() }}, func(line string) {
		if lines == 0 {
			first = time.Now()
		}
		lines++
		if line == endMarker {
			last, done = time.Now(), true
			cancel()
			return
		}
		tr.Feed(line)
	})
	if err != nil || !done {
		fmt.Fprintf(stderr, "follow-log: ended before the end marker: %v\n", err)
		return 1
	}
	pools := 0
	if facts, ok := tr.Facts(); ok {
		pools = len(facts.Ranks)
	}
	rep, _ := json.Marshal(followReport{Lines: lines, Seconds: last.Sub(first).Seconds(), Pools: pools})
	fmt.Fprintln(stdout, string(rep))
	return 0
}
