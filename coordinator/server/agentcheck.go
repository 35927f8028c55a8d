package server

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"heft/gateway/scale"
	"heft/gateway/target"
	"heft/shared/settings"
)

// HAProxy's agent check, served by the coordinator: a way to route by
// heft's weights with no daemon beside the gateway. Each HAProxy server
// names its worker in agent-send and HAProxy asks every agent-inter:
//
//	server heft-10.0.0.5-8000 10.0.0.5:8000 weight 100 agent-check agent-addr coord.example agent-port 7071 agent-inter 2s agent-send "Qwen/Qwen3-8B 10.0.0.5:8000\n"
//
// The request is one line, "[TOKEN ]MODEL ADDRESS" (the viewer or admin
// token first when the coordinator has a viewer token). The answer is one
// line: "ready N% maxconn:M" for a serving worker (admitted, or stale: its
// agent is gone, its engine not known to be), N its weight scaled to
// 1–100 among the model's serving workers (a percentage of the server's
// configured weight, so configure "weight 100"), M its max_concurrency when
// known; "drain" for a held, offline or unmeasured one; and a line that is
// only a "#" description, which changes nothing in HAProxy but tells
// whoever tries the request by hand (nc) what is wrong, for an address the coordinator does not
// list under that model (agentCheckUnlisted) or a request it refuses
// (agentCheckRefused). A coordinator that does not
// answer changes nothing either (HAProxy keeps the last state), so a
// coordinator restart leaves the gateway as it was.

// The answers that change nothing: a description alone, without a state,
// a weight or maxconn, so whoever reads the answer sees why rather than an
// empty line.
const (
	agentCheckRefused  = `#heft refused this request: agent-send wants "[TOKEN ]MODEL ADDRESS\n", the viewer token first when one is set`
	agentCheckUnlisted = "#heft lists no worker at this address under this model"
)

// agentCheckMaxWeight is the top of the percentages answered.
const agentCheckMaxWeight = 100

// agentCheckTimeout bounds one exchange.
const agentCheckTimeout = 5 * time.Second

// The listener takes anyone's connection, so what one may cost is bounded:
// a request line longer than agentCheckMaxLine (a token, a model name and
// an address fit in a quarter of it) is refused unread, and past
// agentCheckMaxConns exchanges at once a new connection is closed at once
// (HAProxy keeps the server's last state and asks again).
const (
	agentCheckMaxLine  = 1024
	agentCheckMaxConns = 256
)

// agentAnswers holds the answer for each model and address, rebuilt when
// the fleet changes rather than on each of many checks a second.
type agentAnswers map[string]map[string]string

// ServeAgentCheck answers HAProxy agent checks on ln until ctx ends.
func (s *Server) ServeAgentCheck(ctx context.Context, ln net.Listener) error {
	var table atomic.Pointer[agentAnswers]
	rebuild := func() { t := s.agentAnswers(); table.Store(&t) }
	rebuild()
	changes, unsubscribe := s.fleet.Changes()
	defer unsubscribe()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				rebuild()
			}
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		ln.Close()
	})
	s.log.Info("answering HAProxy agent checks", "address", ln.Addr().String())
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		s.addrs.serving(ap.Port()) // no worker may be sent here
	}
	warn := everyMinute(s.log.Warn)
	busy := everyMinute(s.log.Warn)
	slots := make(chan struct{}, s.agentCheckConns())
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("agent check: %w", err)
		}
		select {
		case slots <- struct{}{}:
		default:
			busy("agent check: too many connections at once; closing new ones unanswered", "max", cap(slots),
				"source", conn.RemoteAddr().String())
			conn.Close()
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			s.answerAgentCheck(conn, *table.Load(), warn)
		})
	}
}

func (s *Server) answerAgentCheck(conn net.Conn, answers agentAnswers, warn func(string, ...any)) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(cmp.Or(s.lim.agentCheckTimeout, agentCheckTimeout)))
	line, err := bufio.NewReaderSize(io.LimitReader(conn, agentCheckMaxLine), 512).ReadString('\n')
	if err != nil {
		if err == io.EOF && len(line) == agentCheckMaxLine {
			warn("agent check refused: a request line longer than the limit", "limit", agentCheckMaxLine,
				"source", conn.RemoteAddr().String())
		}
		s.log.Debug("agent check: no request line", "source", conn.RemoteAddr().String(), "error", err)
		return
	}
	ans, refused := s.agentCheckAnswer(strings.TrimSpace(line), answers)
	if refused {
		warn("agent check refused: want agent-send \"[TOKEN ]MODEL ADDRESS\\n\" (the viewer token first when one is configured)",
			"source", conn.RemoteAddr().String())
	}
	_, _ = conn.Write([]byte(ans + "\n"))
}

// everyMinute wraps a log function so that it logs at most once a minute:
// HAProxy repeats a refused check every few seconds.
func everyMinute(log func(string, ...any)) func(string, ...any) {
	var mu sync.Mutex
	var last time.Time
	return func(msg string, kv ...any) {
		mu.Lock()
		due := time.Since(last) >= time.Minute
		if due {
			last = time.Now()
		}
		mu.Unlock()
		if due {
			log(msg, kv...)
		}
	}
}

// agentCheckAnswer answers one request line; refused says it was not a
// request the coordinator takes (a missing or wrong token, bad words).
func (s *Server) agentCheckAnswer(line string, answers agentAnswers) (ans string, refused bool) {
	f := strings.Fields(line)
	tok := s.tokens() // the ones in force, reloaded on SIGHUP
	viewer := tok.Viewer
	switch {
	case viewer == "" && len(f) == 2:
	case viewer != "" && len(f) == 3 && slices.ContainsFunc(append(settings.SplitTokens(viewer), settings.SplitTokens(tok.Admin)...),
		func(t string) bool { return tokenEqual(f[0], t) }):
		f = f[1:]
	default:
		if viewer != "" {
			s.metrics.authFailures.WithLabelValues(authViewer).Inc()
		}
		return agentCheckRefused, true
	}
	ans, ok := answers[f[0]][f[1]]
	if !ok {
		s.log.Debug("agent check for a worker heft does not list", "model", f[0], "address", f[1])
		return agentCheckUnlisted, false
	}
	return ans, false
}

// agentAnswers renders the answer of every worker by model and address,
// as heft-sync would set the server (target.ForModel).
func (s *Server) agentAnswers() agentAnswers {
	byModel := map[string][]string{}
	ws := s.fleet.Workers()
	for _, w := range ws {
		byModel[w.Model] = nil
	}
	out := agentAnswers{}
	for model := range byModel {
		m, _ := target.ForModel(model, ws)
		serving := m.Serving()
		fs := make([]float64, len(serving))
		for i, b := range serving {
			fs[i] = b.Weight
		}
		pct, _ := scale.Ints(fs, agentCheckMaxWeight)
		out[model] = map[string]string{}
		for i, b := range serving {
			a := fmt.Sprintf("ready %d%%", pct[i])
			if b.MaxConcurrency > 0 {
				a += fmt.Sprintf(" maxconn:%d", b.MaxConcurrency)
			}
			out[model][b.Address] = a
		}
		for _, b := range m.Backends {
			if !b.Serving {
				out[model][b.Address] = "drain"
			}
		}
	}
	return out
}

// agentCheckConns is how many agent-check exchanges run at once.
func (s *Server) agentCheckConns() int { return cmp.Or(s.lim.agentCheckConns, agentCheckMaxConns) }
