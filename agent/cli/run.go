package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"heft/agent"
	"heft/agent/config"
	"heft/agent/discover"
	"heft/agent/link"
	"heft/shared/logging"
	"heft/shared/settings"
)

// runRun is the agent service: it collects facts, measures engines when the
// coordinator asks, and keeps the link to the coordinator until SIGINT or
// SIGTERM; SIGHUP reads token_file again. Exit 0 on a signal, 1 when it
// cannot run, 2 on bad flags, 78 (settings.ExitConfig) on a bad
// configuration.
func runRun(args []string, stdio IO) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				select {
				case reload <- struct{}{}:
				default: // one already waits
				}
			}
		}
	}()
	return runAgent(ctx, args, os.Getenv, stdio, agent.WithReload(reload))
}

// runAgent is runRun under a caller's context, for tests.
func runAgent(ctx context.Context, args []string, env func(string) string, stdio IO, opts ...agent.Option) int {
	return runAgentDiscovering(ctx, args, env, stdio, discovery{every: rediscoverEvery}, opts...)
}

// discovery is how discover = true searches: the search's options and how
// often it looks again (tests limit it to the engines they started, and
// look more often).
type discovery struct {
	opts  discover.Options
	every time.Duration
}

// runAgentDiscovering is runAgent with discover = true's search.
func runAgentDiscovering(ctx context.Context, args []string, env func(string) string, stdio IO, d discovery, opts ...agent.Option) int {
	cfg, err := config.Load("", args, env)
	if err == nil {
		// The token and TLS files are configuration too: a problem with
		// them exits as one, before anything starts.
		_, err = cfg.Token()
	}
	if err == nil {
		_, err = cfg.TLSConfig()
	}
	if err == nil {
		// So is state_dir, where the node credential is kept.
		_, err = link.CredentialFile(cfg.StateDir, cfg.Node.Name)
	}
	if err != nil {
		return settings.Exit("heft-agent run", err, config.Usage, stdio.Out, stdio.Err)
	}

	logger := logging.New("heft-agent", cfg.Log.Level, cfg.Log.JSON, stdio.Err)
	cfg.LogSettings(logger)
	if w := cfg.PlainTextWarning(); w != "" {
		// Loud on purpose: on stderr as a banner, and in the log.
		fmt.Fprintf(stdio.Err, "\n%s\n%s\n%s\n\n", strings.Repeat("!", 72), w, strings.Repeat("!", 72))
	}
	run := func() error { return agent.Run(ctx, cfg, logger, opts...) }
	if cfg.Discover {
		run = func() error { return runDiscovering(ctx, cfg, logger, d, opts...) }
	}
	if err := run(); err != nil {
		fmt.Fprintf(stdio.Err, "heft-agent run: %v\n", err)
		return 1
	}
	return 0
}
