package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// it is 100 on every Linux architecture Go supports.
const clockTicks = 100

// ProcStat is one reading of a process from /proc.
type ProcStat struct {
	RSS, HWM uint64  // VmRSS and VmHWM, bytes
	CPU      float64 // utime + stime, seconds
}

// readProc reads /proc/<pid>/status and /proc/<pid>/stat (Linux only).
func readProc(pid int) (ProcStat, error) {
	var st ProcStat
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, fmt.Errorf("read process status (needs Linux /proc): %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return st, fmt.Errorf("unexpected %s line %q", k, line)
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return st, fmt.Errorf("unexpected %s line %q", k, line)
		}
		if k == "VmRSS" {
			st.RSS = n * 1024
		} else {
			st.HWM = n * 1024
		}
	}
	if st.RSS == 0 {
		return st, fmt.Errorf("process %d has no memory: it has exited", pid)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, fmt.Errorf("read process stat: %w", err)
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ")". utime and stime are fields 14 and 15 of the whole line.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return st, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return st, errors.New("unexpected /proc stat format")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return st, errors.New("unexpected /proc stat times")
	}
	st.CPU = float64(ut+stime) / clockTicks
	return st, nil
}

// Usage is what a sampler saw of a process over a window.
type Usage struct {
	RSS        Summary // VmRSS samples, bytes
	HWM        uint64  // VmHWM at the end, bytes: the peak over the whole life
	CPUPercent float64 // of one core, over the window
	Window     time.Duration
	Samples    []float64
}

// sampler reads a process's /proc entries every interval.
type sampler struct {
	pid   int
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	first ProcStat
	last  ProcStat
	t0    time.Time
	t1    time.Time
	rss   []float64
	err   error
}

func startSampler(pid int, every time.Duration) (*sampler, error) {
	first, err := readProc(pid)
	if err != nil {
		return nil, err
	}
	s := &sampler{pid: pid, stop: make(chan struct{}), done: make(chan struct{}), first: first, last: first,
		t0: time.Now(), rss: []float64{float64(first.RSS)}}
	s.t1 = s.t0
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.take()
			}
		}
	}()
	return s, nil
}

func (s *sampler) take() {
	st, err := readProc(s.pid)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.last, s.t1 = st, now
	s.rss = append(s.rss, float64(st.RSS))
}

// Latest returns the newest reading.
func (s *sampler) Latest() ProcStat {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Stop takes a last sample and returns the usage over the window.
func (s *sampler) Stop() (Usage, error) {
	close(s.stop)
	<-s.done
	s.take()
	s.mu.Lock()
	defer s.mu.Unlock()
	u := Usage{RSS: Summarize(s.rss), HWM: s.last.HWM, Window: s.t1.Sub(s.t0), Samples: s.rss}
	if sec := u.Window.Seconds(); sec > 0 {
		u.CPUPercent = 100 * (s.last.CPU - s.first.CPU) / sec
	}
	return u, s.err
}

// child is a process the bench started: a binary under test.
type child struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	errPath string
	exited  chan struct{}
	waitErr error
}

// childIO says which of a child's standard streams the bench uses.
type childIO struct {
	Stdin bool     // Send writes to it
	Lines bool     // stdout lines are kept for Line; otherwise stdout joins the log
	Env   []string // added to the bench's environment
}

// startChild starts bin with args; stderr (and stdout unless io.Lines)
// goes to <dir>/<name>.log.
func startChild(dir, name, bin string, args []string, cio childIO) (*child, error) {
	errPath := filepath.Join(dir, name+".log")
	ef, err := os.Create(errPath)
	if err != nil {
		return nil, err
	}
	defer ef.Close() // the child holds its own descriptor once started
	cmd := exec.Command(bin, args...)
	cmd.Stderr = ef
	if len(cio.Env) > 0 {
		cmd.Env = append(os.Environ(), cio.Env...)
	}
	// Its own process group, so a Ctrl-C reaches only the bench, which then
	// stops its children in order; on Linux they also die with the bench.
	cmd.SysProcAttr = childAttr()
	c := &child{name: name, cmd: cmd, lines: make(chan string, 1024), errPath: errPath, exited: make(chan struct{})}
	if cio.Stdin {
		if c.stdin, err = cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	var out io.ReadCloser
	if cio.Lines {
		if out, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	} else {
		cmd.Stdout = ef
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		if out != nil {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				c.lines <- sc.Text()
			}
		}
		close(c.lines)
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) Pid() int { return c.cmd.Process.Pid }

// Line waits for the next stdout line.
func (c *child) Line(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.exited
			return "", fmt.Errorf("%s exited (%v)%s", c.name, c.waitErr, c.stderrTail())
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("%s said nothing within %s%s", c.name, timeout, c.stderrTail())
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Send writes one line to the child's stdin.
func (c *child) Send(line string) error {
	if c.stdin == nil {
		return fmt.Errorf("%s: no stdin", c.name)
	}
	_, err := io.WriteString(c.stdin, line+"\n")
	return err
}

// Alive reports whether the process is still running.
func (c *child) Alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// Stop asks the child to end (SIGTERM), then kills it after grace.
func (c *child) Stop(grace time.Duration) {
	if c.stdin != nil {
		c.stdin.Close()
	}
	if !c.Alive() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func (c *child) stderrTail() string {
	data, err := os.ReadFile(c.errPath)
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return "; its log ends:\n" + string(data)
}
