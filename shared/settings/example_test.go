package settings_test

import (
	"fmt"
	"os"
	"time"

	"heft/shared/settings"
)

// A binary's whole configuration: a struct, its defaults, and one row per
// setting. Load, help, --version and the exit codes come with it.
func Example() {
	type target struct{ Model, Socket string }
	var cfg struct {
		Interval time.Duration
		Targets  []target
	}
	cfg.Interval = 5 * time.Second
	cmd := settings.Command{
		Name:      "heft-example",
		Synopsis:  "heft-example [--config FILE] [flags]",
		EnvPrefix: "HEFT_EXAMPLE_",
		Version:   true,
		Settings: []settings.Setting{
			settings.Duration("interval", &cfg.Interval, "how often to sync"),
			settings.List("target", &cfg.Targets, "a target, repeatable", settings.ListOf[target]{
				Fields: func(t *target) []settings.Setting {
					return []settings.Setting{settings.String("model", &t.Model, "model"), settings.String("socket", &t.Socket, "socket")}
				},
			}),
		},
	}
	env := map[string]string{"HEFT_EXAMPLE_INTERVAL": "1m"}
	_, err := cmd.Load("", []string{"--target", "model=qwen,socket=/run/a.sock"}, func(k string) string { return env[k] })
	if code := settings.Exit(cmd.Name, err, cmd.Usage, os.Stdout, os.Stdout); code != 0 {
		return
	}
	fmt.Println(cfg.Interval, cfg.Targets)
	// Output: 1m0s [{qwen /run/a.sock}]
}
