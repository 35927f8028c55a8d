// Command swarm opens many simulated agent connections to a heft
// coordinator, for `make bench` (area 5, coordinator scale). It reports on
// stdout, one JSON object a line, and takes commands on stdin:
//
//	visibility N GAP_MS   measure snapshot → API visibility N times, GAP_MS apart
//	stats                 print the counters
//	quit                  (or end of input) close every connection and exit
//
// Events: {"event":"connected",...} once every agent said hello and sent its
// first snapshot; {"event":"measured",...} once every agent answered a probe
// request; {"event":"visibility",...}; {"event":"stats",...};
// {"event":"error","message":...} before a non-zero exit.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"heft/bench/swarm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) int {
	var cfg swarm.Config
	fs := flag.NewFlagSet("swarm", flag.ContinueOnError)
	fs.StringVar(&cfg.URL, "url", "ws://127.0.0.1:7070/api/v1/agent", "coordinator agent websocket URL")
	fs.StringVar(&cfg.API, "api", "http://127.0.0.1:7070", "coordinator HTTP base URL")
	fs.StringVar(&cfg.Token, "token", "", "agent token (or HEFT_TOKEN)")
	fs.IntVar(&cfg.Agents, "agents", 1000, "simulated agents")
	fs.IntVar(&cfg.Models, "models", 10, "models the engines are spread over")
	fs.StringVar(&cfg.Prefix, "prefix", "swarm", "node name prefix")
	fs.DurationVar(&cfg.SnapshotEvery, "snapshot-every", 5*time.Second, "heartbeat of each agent")
	fs.IntVar(&cfg.DialConcurrency, "dial-concurrency", 32, "connection attempts in flight")
	measureTimeout := fs.Duration("measure-timeout", 5*time.Minute, "give up waiting for every agent to be measured")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Token == "" {
		cfg.Token = os.Getenv("HEFT_TOKEN")
	}
	out := json.NewEncoder(stdout)
	emit := func(v map[string]any) { _ = out.Encode(v) }
	fail := func(err error) int {
		emit(map[string]any{"event": "error", "message": err.Error()})
		return 1
	}

	start := time.Now()
	s, err := swarm.Start(ctx, cfg)
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	emit(map[string]any{"event": "connected", "agents": cfg.Agents, "seconds": time.Since(start).Seconds()})

	mctx, cancel := context.WithTimeout(ctx, *measureTimeout)
	err = s.WaitMeasured(mctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	emit(map[string]any{"event": "measured", "agents": cfg.Agents, "seconds": time.Since(start).Seconds(), "stats": s.Stats()})

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return 0
		case line, ok = <-lines:
		}
		if !ok {
			return 0
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "quit":
			return 0
		case "stats":
			emit(map[string]any{"event": "stats", "stats": s.Stats()})
		case "visibility":
			n, gap, err := visibilityArgs(f[1:])
			if err != nil {
				emit(map[string]any{"event": "error", "message": err.Error()})
				continue
			}
			ds, timeouts, err := s.Visibility(ctx, n, gap, time.Millisecond, 10*time.Second)
			if err != nil {
				return fail(err)
			}
			ms := make([]float64, len(ds))
			for i, d := range ds {
				ms[i] = float64(d.Microseconds()) / 1000
			}
			emit(map[string]any{"event": "visibility", "samples_ms": ms, "timeouts": timeouts})
		default:
			emit(map[string]any{"event": "error", "message": fmt.Sprintf("unknown command %q", f[0])})
		}
	}
}

func visibilityArgs(f []string) (int, time.Duration, error) {
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("usage: visibility N GAP_MS")
	}
	n, err1 := strconv.Atoi(f[0])
	gap, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || n < 1 || gap < 0 {
		return 0, 0, fmt.Errorf("visibility: N must be a positive number and GAP_MS a non-negative one")
	}
	return n, time.Duration(gap) * time.Millisecond, nil
}
