// Package app is heft-sync put together: the configuration becomes
// targets, a coordinator follower feeds the syncer, and a small HTTP
// server answers /metrics and /healthz.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/config"
	"heft/gateway/coord"
	"heft/gateway/envoy"
	"heft/gateway/haproxy"
	"heft/gateway/litellm"
	"heft/gateway/nginx"
	"heft/gateway/syncer"
	"heft/gateway/target"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/version"
)

// Main is the whole program; it returns the exit code: 0 done, 1 failed,
// 2 bad usage, 78 bad configuration (settings.ExitConfig).
func Main(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(args, env)
	switch {
	case err != nil:
		return settings.Exit("heft-sync", err, config.PrintUsage, stdout, stderr)
	case cfg.ShowVersion:
		fmt.Fprintf(stdout, "heft-sync %s\n", version.Version)
		return 0
	}
	logger := logging.New("heft-sync", cfg.LogLevel, cfg.LogJSON, stderr)
	cfg.LogSettings(logger)
	if cfg.CheckOnly {
		return Check(ctx, cfg, logger)
	}
	if err := Run(ctx, cfg, logger); err != nil {
		logger.Error("stopped", "error", err)
		if isConfig(err) {
			return settings.ExitConfig // systemd's unit does not restart it (RestartPreventExitStatus)
		}
		return 1
	}
	return 0
}

// configError is a configuration problem found after config.Load: a token
// or CA file, the coordinator's URL, a gateway table that cannot be built.
// Restarting cannot fix it, so heft-sync exits settings.ExitConfig, as
// --check does.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

func isConfig(err error) bool { return errors.As(err, new(configError)) }

// Built is what the configuration becomes.
type Built struct {
	Targets []target.Target
	Envoys  []*envoy.Server
}

// Close releases the xDS listeners of servers that never ran.
func (b Built) Close() {
	for _, s := range b.Envoys {
		s.Close()
	}
}

// Build makes the targets of cfg. Envoy tables that share a listen address
// share one xDS server; LiteLLM tables that share a file share its writer.
func Build(cfg config.Config, logger hclog.Logger) (Built, error) {
	return build(cfg, logger, envoy.NewServer)
}

// build is Build with xds making the xDS server of each Envoy listen
// address: the run binds it (envoy.NewServer), --check may not.
func build(cfg config.Config, logger hclog.Logger, xds func(string, hclog.Logger) (*envoy.Server, error)) (Built, error) {
	var b Built
	var errs []error
	add := func(t target.Target, err error, sel target.Selection) {
		if err != nil {
			errs = append(errs, configError{err})
			return
		}
		b.Targets = append(b.Targets, target.WithSelection(t, sel))
	}
	for _, h := range cfg.HAProxy {
		t, err := haproxy.New(h.Config, logger)
		add(t, err, h.Selection)
	}
	for _, n := range cfg.Nginx {
		t, err := nginx.New(n.Config, logger)
		add(t, err, n.Selection)
	}
	servers := map[string]*envoy.Server{}
	for _, e := range cfg.Envoy {
		s, err := servers[e.Listen], error(nil)
		if s == nil {
			if s, err = xds(e.Listen, logger); err == nil {
				servers[e.Listen] = s
				b.Envoys = append(b.Envoys, s)
			}
		}
		if err != nil {
			errs = append(errs, err) // a port in use: not the configuration's fault
			continue
		}
		add(s.Cluster(e.Model, e.ClusterName()).KeepingState(e.StateFile), nil, e.Selection)
	}
	files := map[string]*litellm.File{}
	for _, l := range cfg.LiteLLM {
		f, err := files[l.File], error(nil)
		if f == nil {
			if f, err = litellm.NewFile(l.File, l.Command, l.Timeout, logger); err == nil {
				files[l.File] = f
			}
		}
		if err != nil {
			errs = append(errs, configError{err})
			continue
		}
		t, err := f.Target(l.Config)
		add(t, err, l.Selection)
	}
	if err := errors.Join(errs...); err != nil {
		b.Close()
		return Built{}, err
	}
	return b, nil
}

// coordinatorConfig is how heft-sync reaches the coordinator: the token
// file read, and a client of its own that trusts ca_file when one is
// set. The caller closes the client's idle connections when done.
func coordinatorConfig(cfg config.Config) (coord.Config, error) {
	token, err := cfg.Token()
	if err != nil {
		return coord.Config{}, configError{err}
	}
	tlsCfg, err := cfg.TLS()
	if err != nil {
		return coord.Config{}, configError{err}
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsCfg
	cc := coord.Config{URL: cfg.Coordinator.URL, Token: token, Client: &http.Client{Transport: transport}}
	if cfg.Coordinator.TokenFile != "" {
		cc.ReadToken = cfg.Token // a token rotated on the coordinator is taken without a restart
	}
	return cc, nil
}

// Run runs heft-sync until ctx ends.
func Run(ctx context.Context, cfg config.Config, logger hclog.Logger) error {
	cc, err := coordinatorConfig(cfg)
	if err != nil {
		return err
	}
	defer cc.Client.CloseIdleConnections()
	built, err := Build(cfg, logger)
	if err != nil {
		return err
	}
	names := make([]string, len(built.Targets))
	for i, t := range built.Targets {
		names[i] = t.Name()
	}
	metrics := syncer.NewMetrics(names)
	sy := syncer.New(built.Targets, metrics, cfg.Resync, logger)
	sy.SetFloor(cfg.Floor)

	follower, err := coord.New(cc, sy.Hooks(), logger)
	if err != nil {
		built.Close()
		return configError{err}
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		built.Close()
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	hs := &http.Server{Handler: Handler(metrics, sy), ReadHeaderTimeout: 10 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(built.Envoys)+1)
	for _, s := range built.Envoys {
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				errc <- err
				cancel()
			}
		})
	}
	wg.Go(func() { sy.Run(ctx) })
	wg.Go(func() { follower.Run(ctx) })
	wg.Go(func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("serve %s: %w", cfg.Listen, err)
			cancel()
		}
	})
	logger.Info("heft-sync started", "version", version.Version, "coordinator", cfg.Coordinator.URL,
		"listen", ln.Addr().String(), "targets", len(built.Targets), "resync", cfg.Resync)
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = hs.Shutdown(sctx)
	scancel()
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// Handler serves /metrics and /healthz.
func Handler(m *syncer.Metrics, sy *syncer.Syncer) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(sy.Status())
	})
	return mux
}
