package app_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/gateway/app"
	"heft/gateway/config"
	"heft/gateway/gwtest"
	"heft/shared/settings"
	"heft/shared/testutil"
	"heft/shared/view"
)

// checkRig is a fake coordinator that wants a token, a real HAProxy and a
// real nginx, and a heft-sync file naming them.
type checkRig struct {
	coord *gwtest.Coordinator
	hx    *gwtest.HAProxy
	nx    *gwtest.Nginx
	dir   string
}

func newCheckRig(t *testing.T) *checkRig {
	t.Helper()
	r := &checkRig{coord: gwtest.NewCoordinator(t), dir: t.TempDir()}
	r.coord.SetToken("viewer-secret")
	r.coord.SetWorkers(gwtest.Worker(model, "127.0.0.1:9001", "ready", 1))
	r.hx = gwtest.StartHAProxy(t, haproxyCfg)
	up := gwtest.NewUpstream(t, "a")
	r.nx = gwtest.StartNginx(t, gwtest.NginxConf(nginxHTTP), "upstream qwen { server "+up.Addr+"; }\n")
	return r
}

// check writes the file with token and nginx check command and runs --check.
func (r *checkRig) check(t *testing.T, token string, nginxCheck []string) (int, string) {
	t.Helper()
	tokenFile := filepath.Join(r.dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var q []string
	for _, x := range nginxCheck {
		q = append(q, fmt.Sprintf("%q", x))
	}
	path := filepath.Join(r.dir, "heft-sync.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`[coordinator]
url = %q
token_file = %q
[[haproxy]]
model = %q
socket = %q
backend = "qwen"
[[nginx]]
model = %q
file = %q
upstream = "qwen"
check = [%s]
reload = ["true"]
`, r.coord.URL(), tokenFile, model, r.hx.Socket, model, r.nx.Upstream, strings.Join(q, ", "))), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", path, "--check"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	code := app.Check(context.Background(), cfg, hclog.New(&hclog.LoggerOptions{Output: &out}))
	return code, out.String()
}

// --check does what the run will do: it reads the coordinator with the
// token, finds the model, reaches HAProxy's socket and runs nginx's check
// command; each failure names its step and makes the exit code 1.
func TestCheckRunsEveryStep(t *testing.T) {
	r := newCheckRig(t)
	code, out := r.check(t, "viewer-secret", r.nx.Check())
	for _, want := range []string{"step=coordinator", "step=model", "target=haproxy:qwen", "target=nginx:qwen"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the log", want)
		}
	}
	if code != 0 || strings.Contains(out, "check failed") {
		t.Fatalf("all good: code %d\n%s", code, out)
	}

	code, out = r.check(t, "wrong", r.nx.Check())
	if code != 1 || !strings.Contains(out, "step=coordinator") || !strings.Contains(out, "401") || !strings.Contains(out, "token_file") {
		t.Fatalf("wrong token: code %d\n%s", code, out)
	}

	// nginx -t against a file that is not there fails as the first apply would.
	bad := r.nx.Check()
	for i, a := range bad {
		if a == r.nx.Conf {
			bad[i] = filepath.Join(r.dir, "missing.conf")
		}
	}
	code, out = r.check(t, "viewer-secret", bad)
	if code != 1 || !strings.Contains(out, "step=gateway") || !strings.Contains(out, "test failed") || !strings.Contains(out, "missing.conf") {
		t.Fatalf("failing nginx check: code %d\n%s", code, out)
	}

	// A model no worker serves yet is a warning that lists what the
	// coordinator does serve; the run would wait for it, so the check passes.
	r.coord.SetWorkers(gwtest.Worker("other/model", "127.0.0.1:9001", "ready", 1))
	code, out = r.check(t, "viewer-secret", r.nx.Check())
	if code != 0 || !strings.Contains(out, "[WARN]") || !strings.Contains(out, "coordinator_models=other/model") {
		t.Fatalf("unseen model: code %d\n%s", code, out)
	}

	r.coord.Stop()
	code, out = r.check(t, "viewer-secret", r.nx.Check())
	if code != 1 || !strings.Contains(out, "step=coordinator") {
		t.Fatalf("coordinator down: code %d\n%s", code, out)
	}
}

// Every configuration problem exits 78 (EX_CONFIG), as for every heft
// binary, from --check and from the service alike: one config.Load reports
// (an unknown key) and one only building the targets finds (an nginx file
// in a folder that does not exist: the check's configuration step). The
// service exited 1 for the second, and systemd restarted it in a loop. A
// port in use is no configuration problem: 1, restarted.
func TestBadConfigurationIs78(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("viewer-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	coordinator := fmt.Sprintf("[coordinator]\nurl = \"http://127.0.0.1:1\"\ntoken_file = %q\n", tokenFile)
	nginx := fmt.Sprintf("[[nginx]]\nmodel = \"m\"\nfile = %q\nupstream = \"qwen\"\nreload = [\"true\"]\n",
		filepath.Join(dir, "no-such-folder", "up.conf"))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	litellm := fmt.Sprintf("[[litellm]]\nmodel = \"m\"\nfile = %q\n", filepath.Join(dir, "models.yaml"))
	env := func(string) string { return "" }
	for _, c := range []struct {
		name, file string
		service    bool // without --check
		code       int
		want       []string
	}{
		{"unknown key", "bogus_key = 1\n" + coordinator, false, settings.ExitConfig, []string{"bogus_key"}},
		{"unbuildable target", coordinator + nginx, false, settings.ExitConfig, []string{`"step":"configuration"`, "its folder does not exist"}},
		{"service: unknown key", "bogus_key = 1\n" + coordinator, true, settings.ExitConfig, []string{"bogus_key"}},
		{"service: unbuildable target", coordinator + nginx, true, settings.ExitConfig, []string{`"@message":"stopped"`, "its folder does not exist"}},
		{"service: listen in use", fmt.Sprintf("listen = %q\n", busy.Addr()) + coordinator + litellm, true, 1, []string{"address already in use"}},
	} {
		path := filepath.Join(dir, "heft-sync.toml")
		if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"--config", path, "--log-json"}
		if !c.service {
			args = append(args, "--check")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out, errb testutil.SyncBuffer
		code := app.Main(ctx, args, env, &out, &errb)
		cancel()
		if code != c.code {
			t.Errorf("%s: code %d, want %d\n%s", c.name, code, c.code, errb.String())
		}
		for _, w := range c.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%s: no %q on stderr\n%s", c.name, w, errb.String())
			}
		}
	}
}

// envoyCheck is a heft-sync file with one [[envoy]] table on xds, its
// state file in dir, and a fake coordinator with one worker of the model.
func envoyCheck(t *testing.T, xds string) (config.Config, string) {
	t.Helper()
	c := gwtest.NewCoordinator(t)
	c.SetWorkers(gwtest.Worker(model, "127.0.0.1:9001", view.StateAdmitted, 1))
	dir := t.TempDir()
	path := filepath.Join(dir, "heft-sync.toml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`listen = "127.0.0.1:%d"
[coordinator]
url = %q
[[envoy]]
listen = %q
model = %q
cluster = "qwen"
state_file = %q
`, gwtest.FreePort(t), c.URL(), xds, model, filepath.Join(dir, "envoy-qwen.json"))), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--config", path, "--check"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return cfg, dir
}

func runCheck(cfg config.Config) (int, string) {
	var out testutil.SyncBuffer
	code := app.Check(context.Background(), cfg, hclog.New(&hclog.LoggerOptions{Output: &out}))
	return code, out.String()
}

// Operators run --check after editing the file, while the heft-sync
// service runs and holds the Envoy table's xDS address. The check bound it
// and failed there ("address already in use"); now it asks what holds the
// address over real gRPC, finds the service's xDS server publishing the
// cluster, passes the step without binding, and runs every other step.
// Before the first start the address is free and the check binds it.
func TestCheckBesideTheRunningService(t *testing.T) {
	xds := fmt.Sprintf("127.0.0.1:%d", gwtest.FreePort(t))
	cfg, dir := envoyCheck(t, xds)
	code, out := runCheck(cfg)
	if code != 0 || strings.Contains(out, "in use") {
		t.Fatalf("before the first start: code %d\n%s", code, out)
	}
	if !strings.Contains(out, "ok: step=listen listen="+xds) {
		t.Errorf("before the first start: no listen step\n%s", out)
	}

	run := cfg
	run.CheckOnly = false
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, run, hclog.New(&hclog.LoggerOptions{Output: t.Output()})) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, "the service to publish the cluster", 10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(dir, "envoy-qwen.json"))
		return err == nil
	})

	code, out = runCheck(cfg)
	for _, want := range []string{
		"ok: in use by a running xDS server (the heft-sync service?), not bound by the check: step=listen listen=" + xds,
		`published="version 1, qwen: 1 endpoints"`,
		"ok: step=coordinator",
		"ok: step=model",
		"ok: step=gateway target=envoy:qwen",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the log\n%s", want, out)
		}
	}
	if code != 0 || strings.Contains(out, "check failed") || strings.Contains(out, "published what heft-sync last published") {
		t.Fatalf("beside the service: code %d\n%s", code, out)
	}
	select {
	case err := <-done:
		t.Fatalf("the service stopped: %v", err)
	default:
	}
}

// What the check was for stays: an Envoy table's address that another
// program holds (a plain TCP listener, no xDS server) fails the listen
// step naming the address, and the other steps still run.
func TestCheckFailsOnAnAddressAnotherProgramHolds(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	xds := busy.Addr().String()
	cfg, _ := envoyCheck(t, xds)
	code, out := runCheck(cfg)
	if code != 1 || !strings.Contains(out, "check failed: step=listen") || !strings.Contains(out, "listen="+xds) ||
		!strings.Contains(out, "address already in use") || !strings.Contains(out, "answered on "+xds) ||
		!strings.Contains(out, "not an xDS server") || strings.Contains(out, "in use by a running xDS server") {
		t.Fatalf("address held by another program: code %d\n%s", code, out)
	}
	for _, want := range []string{"ok: step=coordinator", "ok: step=model", "ok: step=gateway target=envoy:qwen"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the log: the other steps did not run\n%s", want, out)
		}
	}
}
