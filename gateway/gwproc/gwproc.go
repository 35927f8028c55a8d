// Package gwproc says how to run a real haproxy and nginx unprivileged
// from a folder of their own: in the foreground, with no system path and
// no privileged port. heft-sync's tests and the routing benchmark both run
// them this way; each starts and stops the processes with its own process
// handling, from the command lines here.
package gwproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// RequireEnv names the variable that turns a missing gateway binary from a
// skipped test into a failed one. CI sets it.
const RequireEnv = "HEFT_REQUIRE_GATEWAYS"

// Find returns the path of a gateway binary: on PATH, or in an sbin folder
// (Debian installs haproxy and nginx in /usr/sbin, which a user's PATH may
// lack).
func Find(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (apt-get install -y haproxy nginx)", name)
}

// TB is the part of testing.TB that Require needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Require returns the path of a gateway binary for a test. It skips the
// test when the binary is absent, unless HEFT_REQUIRE_GATEWAYS is set: then
// a missing install fails loudly.
func Require(t TB, name string) string {
	t.Helper()
	path, err := Find(name)
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("%v, and %s is set", err, RequireEnv)
	}
	t.Skipf("%v; set %s=1 to make this a failure", err, RequireEnv)
	return ""
}

// HAProxyArgs runs haproxy on config in the foreground (-db: no daemon,
// messages on stderr), so that it is the process its caller started.
func HAProxyArgs(config string) []string { return []string{"-f", config, "-db"} }

// CheckHAProxy runs "haproxy -c" on config; the error carries haproxy's
// own explanation.
func CheckHAProxy(ctx context.Context, bin, config string) error {
	out, err := exec.CommandContext(ctx, bin, "-c", "-f", config).CombinedOutput()
	if err != nil {
		return fmt.Errorf("haproxy -c -f %s: %w\n%s", config, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NginxWorkerProcesses is the worker_processes of NginxConf.
const NginxWorkerProcesses = 1

// NginxConf is a whole nginx.conf around the body of its http block, for
// an nginx whose prefix is dir: in the foreground, one worker process (so
// least_conn counts every connection without a shared zone), its pid file,
// error log and temporary files in dir (dir/tmp must exist), no access log.
func NginxConf(dir, httpBody string) string {
	return strings.ReplaceAll(`daemon off;
master_process on;
worker_processes `+strconv.Itoa(NginxWorkerProcesses)+`;
pid {{dir}}/nginx.pid;
error_log {{dir}}/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path {{dir}}/tmp/body;
    proxy_temp_path {{dir}}/tmp/proxy;
    fastcgi_temp_path {{dir}}/tmp/fastcgi;
    uwsgi_temp_path {{dir}}/tmp/uwsgi;
    scgi_temp_path {{dir}}/tmp/scgi;
`, "{{dir}}", dir) + httpBody + "\n}\n"
}

// NginxArgs runs nginx with prefix dir on conf (see NginxConf).
func NginxArgs(dir, conf string) []string { return []string{"-p", dir, "-c", conf} }

// NginxCheck is the "nginx -t" command line for that nginx.
func NginxCheck(bin, dir, conf string) []string {
	return []string{bin, "-t", "-q", "-p", dir, "-c", conf}
}

// NginxReload is the "nginx -s reload" command line for that nginx.
func NginxReload(bin, dir, conf string) []string {
	return []string{bin, "-p", dir, "-c", conf, "-s", "reload"}
}
