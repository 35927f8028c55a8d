package haproxy

import (
	"context"
	"strings"
	"time"
)

// DefaultWatchEvery is how often heft-sync asks HAProxy which process
// answers, to notice a reload or restart well within a second.
const DefaultWatchEvery = 250 * time.Millisecond

// process names one HAProxy process: a reload (master-worker) or a
// restart starts a new one, with a new pid and start time, from the file.
type process struct {
	Pid, Start string
}

// parseInfo reads Pid and Start_time_sec from "show info" (a version
// without Start_time_sec is known by its pid alone).
func parseInfo(answer string) (process, bool) {
	var p process
	for line := range strings.Lines(answer) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "Pid":
			p.Pid = strings.TrimSpace(v)
		case "Start_time_sec":
			p.Start = strings.TrimSpace(v)
		}
	}
	return p, p.Pid != ""
}

// Watch implements syncer.Watcher: it calls lost as soon as another
// HAProxy process answers on the socket than the one seen before (a
// reload or a restart, which start from the file and so lose what heft-sync
// set at run time), until ctx ends. A socket that stops answering and
// comes back with the same process is no loss.
func (h *HAProxy) Watch(ctx context.Context, lost func()) {
	every := h.cfg.WatchEvery
	if every <= 0 {
		every = DefaultWatchEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var seen process
	for {
		ans, err := h.c.run(ctx, "show info")
		if cur, ok := parseInfo(ans); err == nil && ok {
			if seen != (process{}) && cur != seen {
				h.log.Info("another haproxy process answers (a reload or restart): applying heft's state again",
					"pid", cur.Pid, "was", seen.Pid)
				lost()
			}
			seen = cur
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
