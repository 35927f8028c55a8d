package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"heft/coordinator/config"
	"heft/coordinator/store"
	"heft/shared/testutil"
)

func writeConfig(t *testing.T, stateDir, extra string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "coordinator.toml")
	body := "listen = \"127.0.0.1:0\"\nstate_dir = \"" + stateDir + "\"\nagent_token = \"s3cret-0123456789abcdef0123456789\"\nadmin_token = \"adm1n-0123456789abcdef0123456789\"\n" + extra
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) string { return "" }

func TestRunServesAndStops(t *testing.T) {
	stateDir := t.TempDir()
	// The file's state_dir is overridden by the flag, and the log says so.
	fileStateDir := filepath.Join(t.TempDir(), "not-used")
	cfg := writeConfig(t, fileStateDir, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfg, "--state-dir", stateDir}, noEnv, &stdout, &stderr, nil)
	}()

	re := regexp.MustCompile(`heft-coordinator listening on (http://127\.0\.0\.1:\d+) \(dashboard: (http://127\.0\.0\.1:\d+/)\)`)
	var base string
	testutil.Eventually(t, "the listening line", 10*time.Second, func() bool {
		m := re.FindStringSubmatch(stdout.String())
		if m == nil {
			return false
		}
		base = m[1]
		if m[2] != base+"/" {
			t.Errorf("dashboard URL %q", m[2])
		}
		return true
	})
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h struct{ Status string }
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Status != "ok" {
		t.Errorf("healthz: %v %+v", err, h)
	}
	resp.Body.Close()

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr %s", code, stderr.String())
		}
	case <-time.After(time.Minute): // a deadline, not a speed: under test-under-load a stop can take long
		t.Fatal("run did not stop")
	}
	if _, err := os.Stat(filepath.Join(stateDir, store.FileName)); err != nil {
		t.Errorf("no state file: %v", err)
	}
	if _, err := os.Stat(fileStateDir); err == nil {
		t.Errorf("the overridden state_dir %s was used", fileStateDir)
	}
	var settingsLine, overridden map[string]any
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var m map[string]any
		_ = json.Unmarshal([]byte(line), &m)
		switch m["@message"] {
		case "settings: every value not at its default, and where it came from":
			settingsLine = m
		case "setting overridden":
			overridden = m
		}
	}
	if settingsLine["state_dir"] != stateDir+" (flag --state-dir)" || settingsLine["listen"] != "127.0.0.1:0 (file "+cfg+")" ||
		settingsLine["agent_token"] != "[redacted] (file "+cfg+")" {
		t.Errorf("settings line = %v", settingsLine)
	}
	if overridden["@level"] != "warn" || overridden["key"] != "state_dir" || overridden["from"] != "flag --state-dir" ||
		overridden["overrides"] != fileStateDir+" (file "+cfg+")" {
		t.Errorf("override line = %v\n%s", overridden, stderr.String())
	}
	// Logs are JSON off a terminal, and never hold a token.
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
	if strings.Contains(stderr.String(), "s3cret") || strings.Contains(stderr.String(), "adm1n") {
		t.Error("a token was logged")
	}
}

func TestRunRefusesBadState(t *testing.T) {
	stateDir := t.TempDir()
	garbage := bytes.Repeat([]byte("not a database "), 1000)
	if err := os.WriteFile(filepath.Join(stateDir, store.FileName), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr testutil.SyncBuffer
	code := run(context.Background(), []string{"--config", writeConfig(t, stateDir, "")}, noEnv, &stdout, &stderr, nil)
	if code != 78 || !strings.Contains(stderr.String(), filepath.Join(stateDir, store.FileName)) {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	after, _ := os.ReadFile(filepath.Join(stateDir, store.FileName))
	if !bytes.Equal(after, garbage) {
		t.Error("the refused state file was changed")
	}
}

func TestRunUsageErrors(t *testing.T) {
	open := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(open, []byte("tok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // in stdout, or stderr when code != 0
	}{
		{"version", []string{"--version"}, 0, "heft-coordinator "},
		{"help", []string{"-h"}, 0, "--state-dir"},
		{"long help", []string{"--help"}, 0, "usage: heft-coordinator"},
		{"unknown flag", []string{"--bogus"}, 2, "unknown flag: --bogus\n\nusage: heft-coordinator"},
		{"bad flag value", []string{"--offline-grace", "30"}, 2, "--offline-grace: \"30\" has no unit: write 30s"},
		{"open token file", []string{"--state-dir", t.TempDir(), "--agent-token-file", open}, 78, "chmod 600"},
		{"unknown key", []string{"--config", writeConfig(t, t.TempDir(), "colour = \"blue\"\n")}, 78, "unknown keys: colour"},
		{"bare number duration", []string{"--config", writeConfig(t, t.TempDir(), "offline_grace = 30\n")}, 78,
			`offline_grace = 30 is a bare number; a duration needs a unit: write offline_grace = "30s"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.SyncBuffer
			code := run(context.Background(), tc.args, noEnv, &stdout, &stderr, nil)
			got := stdout.String()
			if tc.code != 0 {
				got = stderr.String()
			}
			if code != tc.code || !strings.Contains(got, tc.out) {
				t.Errorf("exit %d, output %q; want %d with %q", code, got, tc.code, tc.out)
			}
		})
	}
}

func TestListenBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var stdout, stderr testutil.SyncBuffer
	code := run(context.Background(), []string{"--config", writeConfig(t, t.TempDir(), ""), "--listen", ln.Addr().String()},
		noEnv, &stdout, &stderr, nil)
	if code != 1 || !strings.Contains(stderr.String(), "address already in use") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestBaseURL(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		tls  bool
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}, false, "http://127.0.0.1:7070"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, true, "https://127.0.0.1:7070"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 80}, false, "http://127.0.0.1:80"},
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 1}, false, "http://10.1.2.3:1"},
	} {
		if got := baseURL(tc.addr, tc.tls); got != tc.want {
			t.Errorf("baseURL(%v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

func TestGenToken(t *testing.T) {
	var a, b, stderr bytes.Buffer
	if code := run(context.Background(), []string{"gen-token"}, noEnv, &a, &stderr, nil); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	run(context.Background(), []string{"gen-token"}, noEnv, &b, &stderr, nil)
	tok := strings.TrimSpace(a.String())
	if len(tok) < 32 || tok == strings.TrimSpace(b.String()) || !regexp.MustCompile(`^[A-Za-z0-9_-]+\n$`).MatchString(a.String()) {
		t.Errorf("gen-token printed %q then %q", a.String(), b.String())
	}
	// What it prints is a token the coordinator accepts.
	if _, err := config.Load(writeConfig(t, t.TempDir(), "viewer_token = \""+tok+"\"\n"), nil, noEnv); err != nil {
		t.Errorf("the printed token was refused: %v", err)
	}
	var help bytes.Buffer
	if code := run(context.Background(), []string{"gen-token", "-h"}, noEnv, &help, &stderr, nil); code != 0 ||
		!strings.Contains(help.String(), "chgrp heft") {
		t.Errorf("gen-token -h: exit %d, printed %q", code, help.String())
	}
	if code := run(context.Background(), []string{"gen-token", "extra"}, noEnv, &a, &stderr, nil); code != 2 {
		t.Errorf("gen-token with an argument: exit %d", code)
	}
}
