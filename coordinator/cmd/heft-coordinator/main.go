// Command heft-coordinator keeps the fleet of inference workers: agents
// report to it over a websocket, it measures and weighs the workers, and
// serves the weights, a dashboard, a JSON API and Prometheus metrics.
// See PRODUCT.md for the contracts and `heft-coordinator -h` for flags.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"heft/coordinator/config"
	"heft/coordinator/fleet"
	"heft/coordinator/server"
	"heft/coordinator/store"
	"heft/shared/address"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit code: 0 done, 1 failed,
// 2 bad usage, 78 bad configuration (settings.ExitConfig).
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	cfg, err := config.Load("", args, env)
	switch {
	case err != nil:
		return settings.Exit("heft-coordinator", err, config.PrintUsage, stdout, stderr)
	case cfg.ShowVersion:
		fmt.Fprintf(stdout, "heft-coordinator %s\n", version.Version)
		return 0
	}

	logger := logging.New("heft-coordinator", cfg.LogLevel, cfg.LogJSON, stderr)
	cfg.LogSettings(logger)

	st, err := store.Open(cfg.StateDir, logger)
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		return 1
	}
	defer func() {
		if err := st.Close(); err != nil {
			logger.Error("close state", "error", err)
		}
	}()

	fc := fleet.DefaultConfig()
	fc.CacheTTL, fc.RemeasureEvery, fc.OfflineGrace = cfg.CacheTTL, cfg.RemeasureEvery, cfg.OfflineGrace
	fc.WeightMin, fc.WeightMax, fc.Thresholds = cfg.WeightMin, cfg.WeightMax, cfg.Thresholds
	f, err := fleet.New(fc, st, nil, logger)
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		return 1
	}
	srv, err := server.New(cfg, f, logger)
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		return 1
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		return 1
	}
	host, _, _ := net.SplitHostPort(cfg.Listen)
	if !cfg.TLS() && !address.IsLoopback(host) {
		logger.Warn("listening without TLS on a non-loopback address: tokens and fleet data cross the network in clear text; "+
			"set tls_cert_file and tls_key_file, or put a TLS proxy in front", "listen", ln.Addr().String())
	}
	url := baseURL(ln.Addr(), cfg.TLS())
	fmt.Fprintf(stdout, "heft-coordinator listening on %s (dashboard: %s/)\n", url, url)
	logger.Info("listening", "address", ln.Addr().String(), "tls", cfg.TLS(), "state_dir", cfg.StateDir, "version", version.Version)

	if err := srv.Run(ctx, ln); err != nil {
		logger.Error("server stopped", "error", err)
		return 1
	}
	logger.Info("stopped")
	return 0
}

// baseURL is where a browser on this host reaches the listener; a wildcard
// address is shown as loopback.
func baseURL(addr net.Addr, tls bool) string {
	scheme := "http"
	if tls {
		scheme = "https"
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return scheme + "://" + addr.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return scheme + "://" + net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port))
}
