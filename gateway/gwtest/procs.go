package gwtest

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"heft/gateway/gwproc"
	"heft/shared/testutil"
)

// HAProxy is a real haproxy run by a test: foreground (-db), unprivileged,
// its admin socket in a temporary folder.
type HAProxy struct {
	t      testing.TB
	bin    string
	Dir    string
	Config string // the configuration file
	Socket string // the admin socket
	Front  string // http://127.0.0.1:PORT of the frontend
	cmd    *exec.Cmd
	log    *testutil.SyncBuffer
	// MasterWorker runs haproxy as a master and a worker (-W), so that
	// Reload reloads it as systemd's ExecReload does; set it before Start.
	MasterWorker bool
}

// StartHAProxy writes cfg and starts haproxy on it. In cfg, {{socket}}
// and {{front}} are replaced by the admin socket's path and the
// frontend's 127.0.0.1:PORT.
func StartHAProxy(t testing.TB, cfg string) *HAProxy {
	t.Helper()
	bin := RequireBinary(t, "haproxy")
	// A unix socket path must stay short (108 bytes): not under t.TempDir.
	dir, err := os.MkdirTemp("", "hx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &HAProxy{t: t, bin: bin, Dir: dir, Socket: filepath.Join(dir, "admin.sock"),
		Front: fmt.Sprintf("127.0.0.1:%d", FreePort(t))}
	cfg = strings.NewReplacer("{{socket}}", h.Socket, "{{front}}", h.Front).Replace(cfg)
	h.Config = filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(h.Config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := gwproc.CheckHAProxy(context.Background(), bin, h.Config); err != nil {
		t.Fatal(err)
	}
	h.Start()
	t.Cleanup(h.Stop)
	return h
}

// Start starts haproxy and waits for its socket and frontend.
func (h *HAProxy) Start() {
	h.t.Helper()
	os.Remove(h.Socket)
	h.log = &testutil.SyncBuffer{}
	args := gwproc.HAProxyArgs(h.Config)
	if h.MasterWorker {
		args = append([]string{"-W"}, args...)
	}
	h.cmd = exec.Command(h.bin, args...)
	h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
	if err := h.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	testutil.Eventually(h.t, "haproxy's admin socket and frontend", 10*time.Second, func() bool {
		c, err := net.Dial("unix", h.Socket)
		if err != nil {
			return false
		}
		c.Close()
		c, err = net.Dial("tcp", h.Front)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// Stop ends haproxy (the one this test started) and waits for it.
func (h *HAProxy) Stop() {
	if h.cmd == nil || h.cmd.Process == nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
	h.cmd = nil
}

// Restart stops haproxy and starts it again from its file: what a reload
// or a restart does to runtime changes.
func (h *HAProxy) Restart() {
	h.t.Helper()
	h.Stop()
	h.Start()
}

// Reload reloads a MasterWorker haproxy (SIGUSR2 to the master): a new
// worker starts from the file and takes the listeners over, the old one
// finishes its requests. It returns once the new worker answers on the
// admin socket. stateFile, when not "", is first written with "show
// servers state", as a reload script does for load-server-state-from-file.
func (h *HAProxy) Reload(stateFile string) {
	h.t.Helper()
	if !h.MasterWorker {
		h.t.Fatal("Reload needs a MasterWorker haproxy")
	}
	old := h.Run("show info")
	if stateFile != "" {
		if err := os.WriteFile(stateFile, []byte(h.Run("show servers state")), 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	pid := func(info string) string {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	// A master that has just started or reloaded ignores SIGUSR2 until it
	// has set up its signal handlers (there is no sign of that but the
	// reload itself), so the signal is sent again every second.
	for start := time.Now(); ; {
		if err := h.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
			h.t.Fatal(err)
		}
		for sent := time.Now(); time.Since(sent) < time.Second; {
			if now := pid(h.try("show info")); now != "" && now != pid(old) {
				return
			}
			time.Sleep(20 * time.Millisecond) // polling the socket for the new worker
		}
		if time.Since(start) > 10*time.Second {
			h.t.Fatalf("no new haproxy worker 10s after SIGUSR2; haproxy's log:\n%s", h.Log())
		}
	}
}

// Run sends one command to the admin socket and returns the answer.
func (h *HAProxy) Run(cmd string) string {
	h.t.Helper()
	ans := h.try(cmd)
	if ans == "" {
		h.t.Fatalf("haproxy %q: no answer", cmd)
	}
	return ans
}

func (h *HAProxy) try(cmd string) string {
	c, err := net.DialTimeout("unix", h.Socket, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd + "\n")); err != nil {
		return ""
	}
	data, _ := io.ReadAll(c)
	return string(data)
}

// Log is haproxy's output so far.
func (h *HAProxy) Log() string { return h.log.String() }

// Stat reads "show stat" from the admin socket: one map per proxy and
// server row, by column name (pxname, svname, status, weight, slim, addr,
// agent_status, ...).
func (h *HAProxy) Stat(t testing.TB) []map[string]string {
	t.Helper()
	c, err := net.Dial("unix", h.Socket)
	if err != nil {
		t.Fatalf("haproxy admin socket: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("show stat\n")); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(string(data), "# "))).ReadAll()
	if err != nil || len(rows) == 0 {
		t.Fatalf("show stat: %v\n%s", err, data)
	}
	var out []map[string]string
	for _, row := range rows[1:] {
		m := map[string]string{}
		for i, col := range rows[0] {
			if i < len(row) {
				m[col] = row[i]
			}
		}
		out = append(out, m)
	}
	return out
}

// ServerStat is the "show stat" row of the server at addr (host:port) in
// backend, nil when there is none.
func (h *HAProxy) ServerStat(t testing.TB, backend, addr string) map[string]string {
	t.Helper()
	for _, row := range h.Stat(t) {
		if row["pxname"] == backend && row["addr"] == addr && row["svname"] != "BACKEND" {
			return row
		}
	}
	return nil
}

// WaitSlowChecksPass waits until the engine u (NewSlowHealthUpstream) has
// answered n of HAProxy's health checks late and HAProxy took the last
// one (check_status L7OK, check_duration at least u's delay) for the
// server at u's address in backend, and fails the test as soon as a
// check of that server fails or marks it down: a healthy engine whose
// /health is slow must stay in the backend.
func (h *HAProxy) WaitSlowChecksPass(t testing.TB, backend string, u *Upstream, n int64) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d late health checks of %s to pass", n, u.Addr), 90*time.Second, func() bool {
		t.Helper()
		row := h.ServerStat(t, backend, u.Addr)
		if row == nil {
			t.Fatalf("backend %s has no server at %s", backend, u.Addr)
		}
		if strings.HasPrefix(row["status"], "DOWN") || row["chkfail"] != "0" || row["chkdown"] != "0" {
			t.Fatalf("HAProxy failed the health check of a healthy engine whose /health answers after %v: status %q, check_status %q, "+
				"check_duration %sms, chkfail %s, chkdown %s; haproxy's log:\n%s",
				u.HealthDelay, row["status"], row["check_status"], row["check_duration"], row["chkfail"], row["chkdown"], h.Log())
		}
		ms, _ := strconv.Atoi(row["check_duration"])
		return u.HealthChecks() >= n && row["check_status"] == "L7OK" && time.Duration(ms)*time.Millisecond >= u.HealthDelay
	})
}

// Nginx is a real nginx run by a test: foreground (daemon off), with its
// prefix, pid file, logs and temporary paths in a temporary folder.
type Nginx struct {
	t        testing.TB
	bin      string
	Dir      string
	Conf     string // nginx.conf
	Upstream string // the file heft-sync writes, included by nginx.conf
	Front    string // 127.0.0.1:PORT
	cmd      *exec.Cmd
	log      *testutil.SyncBuffer
	wrap     []string // a command nginx and its check run under (StartNginxHosts)
}

// NginxConf writes nginx.conf around an http block body; {{front}} and
// {{upstream_file}} are replaced.
func NginxConf(httpBody string) string { return gwproc.NginxConf("{{dir}}", httpBody) }

// StartNginx writes conf (see NginxConf) and the first upstream file, and
// starts nginx. upstream is the upstream file's first content: nginx must
// start with a valid configuration.
func StartNginx(t testing.TB, conf, upstream string) *Nginx {
	t.Helper()
	return startNginx(t, newNginx(t), conf, upstream)
}

// newNginx makes the folder of an nginx not started yet.
func newNginx(t testing.TB) *Nginx {
	t.Helper()
	bin := RequireBinary(t, "nginx")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Nginx{t: t, bin: bin, Dir: dir, Conf: filepath.Join(dir, "nginx.conf"),
		Upstream: filepath.Join(dir, "heft-upstream.conf"), Front: fmt.Sprintf("127.0.0.1:%d", FreePort(t))}
}

// startNginx writes n's files and starts it, under n.wrap if set.
func startNginx(t testing.TB, n *Nginx, conf, upstream string) *Nginx {
	t.Helper()
	dir := n.Dir
	conf = strings.NewReplacer("{{dir}}", dir, "{{front}}", n.Front, "{{upstream_file}}", n.Upstream).Replace(conf)
	if err := os.WriteFile(n.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.Upstream, []byte(upstream), 0o644); err != nil {
		t.Fatal(err)
	}
	n.log = &testutil.SyncBuffer{}
	args := append(append(slices.Clone(n.wrap), n.bin), gwproc.NginxArgs(dir, n.Conf)...)
	n.cmd = exec.Command(args[0], args[1:]...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	testutil.Eventually(t, "nginx to listen", 10*time.Second, func() bool {
		c, err := net.Dial("tcp", n.Front)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	return n
}

// Check is the "nginx -t" command for this nginx.
func (n *Nginx) Check() []string {
	return append(slices.Clone(n.wrap), gwproc.NginxCheck(n.bin, n.Dir, n.Conf)...)
}

// Reload is the "nginx -s reload" command for this nginx.
func (n *Nginx) Reload() []string {
	// nginx -s reload reads the whole configuration too, names included.
	return append(slices.Clone(n.wrap), gwproc.NginxReload(n.bin, n.Dir, n.Conf)...)
}

// Stop ends nginx (the one this test started) and waits for it.
func (n *Nginx) Stop() {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGQUIT)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-done
	}
	n.cmd = nil
}

// WaitOneGeneration waits, after a request was answered by the file just
// reloaded, until no nginx worker of the file before is left to take the
// next one: an old worker keeps accepting connections a moment after a
// reload (gwproc.WaitNginxOneGeneration).
func (n *Nginx) WaitOneGeneration() {
	n.t.Helper()
	if n.cmd == nil || n.cmd.Process == nil {
		n.t.Fatal("nginx is not running")
	}
	if err := gwproc.WaitNginxOneGeneration(context.Background(), n.cmd.Process.Pid, 30*time.Second); err != nil {
		n.t.Fatal(err)
	}
}

// Log is nginx's output so far.
func (n *Nginx) Log() string {
	data, _ := os.ReadFile(filepath.Join(n.Dir, "error.log"))
	return n.log.String() + string(data)
}

// CheckHAProxyConfig runs "haproxy -c" on cfg and fails the test with
// haproxy's own words when it refuses it.
func CheckHAProxyConfig(t testing.TB, cfg string) {
	t.Helper()
	bin := RequireBinary(t, "haproxy")
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c refuses the configuration: %v\n%s\n--- configuration:\n%s", err, out, cfg)
	}
}

// CheckNginxConfig runs "nginx -t" on an nginx.conf around httpBody (see
// NginxConf), with upstream as the file {{upstream_file}} names, and
// fails the test with nginx's own words when it refuses them.
func CheckNginxConfig(t testing.TB, httpBody, upstream string) {
	t.Helper()
	bin := RequireBinary(t, "nginx")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf, up := filepath.Join(dir, "nginx.conf"), filepath.Join(dir, "heft-upstream.conf")
	text := strings.NewReplacer("{{dir}}", dir, "{{front}}", "127.0.0.1:9", "{{upstream_file}}", up).Replace(NginxConf(httpBody))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(up, []byte(upstream), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-p", dir, "-c", conf).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t refuses the configuration: %v\n%s\n--- upstream file:\n%s", err, out, upstream)
	}
}
