package app

import (
	"context"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/config"
	"heft/gateway/coord"
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
	built, err := Build(cfg, logger)
	if err != nil {
		failed("configuration", err)
		if !isConfig(err) {
			return 1 // an Envoy table's listen address in use
		}
		return settings.ExitConfig
	}
	defer built.Close()
	code := 0
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
