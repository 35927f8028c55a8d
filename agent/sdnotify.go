package agent

import (
	"context"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
)

// systemd is the agent's side of systemd's notify protocol (sd_notify(3)),
// for a unit with Type=notify and WatchdogSec=: READY=1 once the agent
// runs, then WATCHDOG=1 every half watchdog interval for as long as the
// agent is not stuck (the judgement /healthz makes), so that systemd
// restarts an agent that stopped taking snapshots. Without NOTIFY_SOCKET
// (not under systemd) it does nothing.
type systemd struct {
	socket   string
	interval time.Duration // 0: no watchdog
	log      hclog.Logger
}

// systemdFromEnv reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID.
func systemdFromEnv(getenv func(string) string, logger hclog.Logger) *systemd {
	sock := getenv("NOTIFY_SOCKET")
	if sock == "" {
		return nil
	}
	s := &systemd{socket: sock, log: logger}
	usec, err := strconv.ParseInt(getenv("WATCHDOG_USEC"), 10, 64)
	pid := getenv("WATCHDOG_PID")
	if err == nil && usec > 0 && (pid == "" || pid == strconv.Itoa(os.Getpid())) {
		s.interval = time.Duration(usec) * time.Microsecond / 2
	}
	return s
}

// notify sends one state line to systemd.
func (s *systemd) notify(state string) error {
	addr := &net.UnixAddr{Name: s.socket, Net: "unixgram"}
	if s.socket[0] == '@' {
		addr.Name = "\x00" + s.socket[1:] // an abstract socket
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

// run says READY=1, then pings the watchdog while stuck() is false,
// until ctx ends.
func (s *systemd) run(ctx context.Context, stuck func() bool) {
	if err := s.notify("READY=1"); err != nil {
		s.log.Warn("cannot tell systemd the agent is ready", "socket", s.socket, "error", err)
	}
	if s.interval <= 0 {
		return
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	quiet := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if stuck() {
			if !quiet {
				s.log.Error("agent stuck: no snapshot for too long; no longer feeding systemd's watchdog, which will restart it")
			}
			quiet = true
			continue
		}
		quiet = false
		if err := s.notify("WATCHDOG=1"); err != nil {
			s.log.Debug("systemd watchdog ping failed", "error", err)
		}
	}
}
