// Command heft-coordinator keeps the fleet of inference workers: agents
// report to it over a websocket, it measures and weighs the workers, and
// serves the weights, a dashboard, a JSON API and Prometheus metrics.
// See PRODUCT.md for the contracts and `heft-coordinator -h` for flags.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"heft/coordinator"
	"heft/coordinator/config"
	"heft/coordinator/store"
	"heft/shared/logging"
	"heft/shared/settings"
	"heft/shared/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, hup)
	signal.Stop(hup)
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit code: 0 done, 1 failed,
// 2 bad usage, 78 bad configuration or a state file it will not use
// (settings.ExitConfig; the unit does not restart on it). Each value on
// reload (SIGHUP) reloads the tokens and the TLS certificate.
func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer, reload <-chan os.Signal) int {
	if len(args) > 0 && args[0] == "gen-token" {
		return genToken(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "backup" {
		return backup(ctx, args[1:], env, stdout, stderr) // backup.go
	}
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

	c, err := coordinator.New(cfg, coordinator.WithLogger(logger))
	if err != nil {
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		if errors.Is(err, store.ErrRefused) {
			// A state file that needs a person (corrupt, newer, empty):
			// restarting will not help, so the unit must not retry.
			return settings.ExitConfig
		}
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		_ = c.Close()
		fmt.Fprintf(stderr, "heft-coordinator: %v\n", err)
		return 1
	}
	runCtx, stopReloads := context.WithCancel(ctx)
	var reloads sync.WaitGroup
	reloads.Go(func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case <-reload:
				_ = c.Reload() // it logs what it did or why it kept the old values
			}
		}
	})
	defer func() {
		stopReloads()
		reloads.Wait()
	}()
	url := baseURL(ln.Addr(), cfg.TLS())
	fmt.Fprintf(stdout, "heft-coordinator listening on %s (dashboard: %s/)\n", url, url)
	if err := c.Run(ctx, ln); err != nil {
		logger.Error("server stopped", "error", err)
		return 1
	}
	return 0
}

// genToken prints a new random token, for agent_token, admin_token or
// viewer_token files.
func genToken(args []string, stdout, stderr io.Writer) int {
	// The file is made readable by group heft, which the packaged
	// coordinator runs as, and by no one else.
	const help = "heft-coordinator gen-token takes no arguments; it prints a new random token:\n" +
		"  (umask 027 && heft-coordinator gen-token > /etc/heft/agent.token) && chgrp heft /etc/heft/agent.token\n"
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, help)
		return 0
	}
	if len(args) > 0 {
		fmt.Fprint(stderr, help)
		return settings.ExitUsage
	}
	fmt.Fprintln(stdout, config.NewToken())
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
