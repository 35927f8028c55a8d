package cli

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent"
	"heft/agent/config"
	"heft/agent/discover"
	"heft/agent/engine/proc"
	"heft/shared/wire"
)

// rediscoverEvery is how often an agent with discover = true looks for
// engines again: as often as an engine's process is looked up again.
const rediscoverEvery = proc.Recheck

// runDiscovering runs the agent with the configured engines and those
// found on this host, and looks again every rediscoverEvery: when it finds
// an engine it did not have (or one whose kind or log changed), it logs
// what changed and restarts the agent with the new set. An engine found
// once stays until the agent stops: a stopped engine is reported as down,
// as a configured one is, not dropped from the node.
func runDiscovering(ctx context.Context, cfg config.Config, logger hclog.Logger, d discovery, opts ...agent.Option) error {
	log := logger.Named("discover")
	var found []config.Engine
	engines, _ := rediscover(ctx, cfg, &found, d.opts, log, true)
	for {
		run := cfg
		run.Engines = engines
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(runCtx, run, logger, opts...) }()
		tick := time.NewTicker(d.every)
		restart := false
		for !restart {
			select {
			case err := <-done:
				tick.Stop()
				cancel()
				return err
			case <-tick.C:
				engines, restart = rediscover(ctx, cfg, &found, d.opts, log, false)
			}
		}
		tick.Stop()
		log.Info("engines on this host changed: restarting the agent with them", "engines", len(engines))
		cancel()
		if err := <-done; err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// rediscover looks for engines, adds what is new to found, and returns
// the engines to run (the configured ones, then those found that no
// configured one covers) and whether found changed. It logs each engine
// it adds; first is the search at start, which also says when nothing is
// found.
func rediscover(ctx context.Context, cfg config.Config, found *[]config.Engine, dopts discover.Options, log hclog.Logger, first bool) ([]config.Engine, bool) {
	if dopts.PodsRoot == "" {
		dopts.PodsRoot = cfg.EngineLogs.PodsRoot
	}
	got, notes, err := discover.Find(ctx, dopts)
	if err != nil {
		log.Warn("cannot look for engines on this host", "error", err)
	}
	if first {
		for _, n := range notes {
			log.Info("not an engine: " + n)
		}
	}
	changed := false
	for _, g := range got {
		e := config.Engine{Kind: g.Kind, URL: g.URL, Log: g.Log}
		if covered(cfg.Engines, e.URL) {
			if first {
				log.Info("found an engine already configured", "kind", g.Kind, "url", g.URL)
			}
			continue
		}
		i := indexURL(*found, e.URL)
		switch {
		case i >= 0 && (*found)[i] == e:
			continue
		case i >= 0:
			(*found)[i] = e
		default:
			*found = append(*found, e)
		}
		changed = true
		logLine := g.Log
		if logLine == "" {
			logLine = "none found (its stdout and stderr go to neither a file nor a journal); give it in an [[engine]] table"
		}
		log.Info("found an engine", "kind", g.Kind, "url", g.URL, "log", logLine, "pid", g.PID, "args", strings.Join(g.Argv, " "))
	}
	if first && len(got) == 0 {
		log.Warn("discover = true found no engine on this host: no process launches one and nothing answers on an engine's default port")
	}
	engines := append(append([]config.Engine(nil), cfg.Engines...), *found...)
	if len(engines) > wire.MaxEngines {
		log.Warn("more engines than a node may report: the rest are left out", "found", len(engines), "max", wire.MaxEngines)
		engines = engines[:wire.MaxEngines]
	}
	return engines, changed
}

// covered reports whether a configured engine is the one at u: the same
// port on this host.
func covered(configured []config.Engine, u string) bool {
	port := urlPort(u)
	for _, c := range configured {
		cu, err := url.Parse(c.URL)
		if err == nil && proc.IsLocalHost(cu.Hostname()) && urlPort(c.URL) == port {
			return true
		}
	}
	return false
}

// urlPort is a URL's port, with the scheme's default.
func urlPort(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

func indexURL(engines []config.Engine, u string) int {
	for i, e := range engines {
		if e.URL == u {
			return i
		}
	}
	return -1
}
