package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/config"
	"heft/gateway/coord"
	"heft/gateway/envoy"
	"heft/gateway/nginx"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/settings"
)

// Check does once what the run will do, step by step, and returns the exit
// code: 0 every step passed, 1 a step failed (each failure is logged as
// "check failed" with its step), settings.ExitConfig (78, as for every heft
// binary) the configuration is wrong: config.Load's problems reach Main's
// settings.Exit before Check runs, and the configuration step's here. The
// steps:
//
//   - configuration: the file, the token file and the TLS files load;
//   - listen: each Envoy table's xDS address binds (and is let go) or,
//     while the heft-sync service runs, what holds it answers as an xDS
//     server (envoy.Probe); an address another program holds fails;
//   - coordinator: GET /api/v1/workers answers with the token;
//   - model: each configured model has a worker at the coordinator. A
//     model with none is a warning, not a failure: the coordinator knows a
//     model only through its workers, so a fleet still being set up looks
//     the same as a typo; the warning lists the models it does serve;
//   - gateway: HAProxy's runtime socket answers and the backend exists;
//     nginx's check command (default nginx -t) passes, run as the service
//     runs it.
func Check(ctx context.Context, cfg config.Config, logger hclog.Logger) int {
	failed := func(step string, err error, args ...any) {
		logger.Error("check failed", append([]any{"step", step, "error", err}, args...)...)
	}
	cc, err := coordinatorConfig(cfg)
	if err != nil {
		failed("configuration", err)
		return settings.ExitConfig
	}
	defer cc.Client.CloseIdleConnections()
	code := 0
	built, err := build(cfg, logger, func(listen string, logger hclog.Logger) (*envoy.Server, error) {
		s, err := checkListen(ctx, cfg, listen, logger, failed)
		if err != nil {
			code = 1
		}
		return s, nil
	})
	if err != nil {
		failed("configuration", err)
		if !isConfig(err) {
			return 1
		}
		return settings.ExitConfig
	}
	defer built.Close()
	if !checkCoordinator(ctx, cc, built.Targets, logger, failed) {
		code = 1
	}
	for _, t := range built.Targets {
		var err error
		if c, ok := target.As[syncer.Checker](t); ok {
			err = c.Check(ctx)
		} else if n, ok := target.As[*nginx.Nginx](t); ok {
			err = n.RunCheck(ctx)
		}
		if err != nil {
			failed("gateway", err, "target", t.Name())
			code = 1
			continue
		}
		logger.Info("ok", "step", "gateway", "target", t.Name(), "model", t.Model())
	}
	return code
}

// probeWait is how long the check waits for what holds an Envoy table's
// listen address to answer as an xDS server.
const probeWait = 3 * time.Second

// checkListen is the listen step of an Envoy table's address: the address
// binds, or what holds it answers as an xDS server (the heft-sync service,
// running: the check runs beside it). It returns the server to build the
// address's clusters on, so that the other steps check them either way,
// and the step's failure, logged.
func checkListen(ctx context.Context, cfg config.Config, listen string, logger hclog.Logger,
	failed func(string, error, ...any)) (*envoy.Server, error) {
	s, err := envoy.NewServer(listen, logger)
	if err == nil {
		logger.Info("ok", "step", "listen", "listen", listen)
		return s, nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		failed("listen", err, "listen", listen)
		return envoy.Detached(listen, logger), err
	}
	var clusters []string
	for _, e := range cfg.Envoy {
		if e.Listen == listen {
			clusters = append(clusters, e.ClusterName())
		}
	}
	a, perr := envoy.Probe(ctx, listen, clusters, probeWait)
	if perr != nil {
		err = fmt.Errorf("%w; %w", err, perr)
		failed("listen", err, "listen", listen)
		return envoy.Detached(listen, logger), err
	}
	published := "nothing yet"
	if a.Version != "" {
		var ps []string
		for _, c := range clusters {
			if n, ok := a.Endpoints[c]; ok {
				ps = append(ps, fmt.Sprintf("%s: %d endpoints", c, n))
			} else {
				ps = append(ps, c+": none")
			}
		}
		published = fmt.Sprintf("version %s, %s", a.Version, strings.Join(ps, ", "))
	}
	logger.Info("ok: in use by a running xDS server (the heft-sync service?), not bound by the check",
		"step", "listen", "listen", listen, "published", published)
	return envoy.Detached(listen, logger), nil
}

// checkCoordinator reads the workers once and looks for each target's
// model among them; it reports false when the coordinator cannot be read.
func checkCoordinator(ctx context.Context, cc coord.Config, targets []target.Target,
	logger hclog.Logger, failed func(string, error, ...any)) bool {
	f, err := coord.New(cc, coord.Hooks{}, logger)
	if err != nil {
		failed("coordinator", err)
		return false
	}
	ws, err := f.Workers(ctx)
	if err != nil {
		failed("coordinator", err, "url", cc.URL)
		return false
	}
	logger.Info("ok", "step", "coordinator", "url", cc.URL, "workers", len(ws))
	count := map[string]int{}
	for _, w := range ws {
		count[w.Model]++
	}
	var seen []string
	for _, t := range targets {
		m := t.Model()
		if slices.Contains(seen, m) {
			continue
		}
		seen = append(seen, m)
		if count[m] == 0 {
			known := make([]string, 0, len(count))
			for k := range count {
				known = append(known, k)
			}
			slices.Sort(known)
			logger.Warn("no worker serves this model yet: heft-sync will wait for one; check the name if the fleet is already up",
				"step", "model", "model", m, "coordinator_models", strings.Join(known, ", "))
			continue
		}
		logger.Info("ok", "step", "model", "model", m, "workers", count[m])
	}
	return true
}
