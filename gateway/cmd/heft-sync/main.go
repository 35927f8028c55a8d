// Command heft-sync keeps gateways (HAProxy, nginx, Envoy, LiteLLM) in
// step with the weights of a heft coordinator. See gateway/app.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"heft/gateway/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
