package packaging

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"heft/agent/config"
	"heft/agent/logsource"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// installer runs scripts/install.sh with --prefix against fake binaries
// and a fake systemctl and launchctl that record their calls.
type installer struct {
	t       *testing.T
	root    string // repository
	tmp     string
	token   string // a token file
	binary  string // a fake heft-agent
	fakes   string // folder of the fake systemctl and launchctl
	calls   string // where the fakes record their calls
	running bool   // what the fakes say about the service
}

func newInstaller(t *testing.T) *installer {
	t.Helper()
	in := &installer{t: t, root: testutil.RepoRoot(t), tmp: t.TempDir()}
	in.token = in.file("token", "s3cret\n", 0o600)
	in.binary = in.file("heft-agent", "#!/bin/sh\necho heft-agent v1\n", 0o755)
	in.fakes = filepath.Join(in.tmp, "fakes")
	in.calls = filepath.Join(in.tmp, "calls")
	if err := os.Mkdir(in.fakes, 0o755); err != nil {
		t.Fatal(err)
	}
	// systemctl is-active and launchctl print answer from FAKE_RUNNING.
	fake := `#!/bin/sh
echo "$(basename "$0") $*" >>"$FAKE_CALLS"
case "$1" in is-active | print) [ "$FAKE_RUNNING" = yes ] ;; esac
`
	for _, tool := range []string{"systemctl", "launchctl"} {
		if err := os.WriteFile(filepath.Join(in.fakes, tool), []byte(fake), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return in
}

func (in *installer) file(name, content string, mode os.FileMode) string {
	in.t.Helper()
	p := filepath.Join(in.tmp, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		in.t.Fatal(err)
	}
	return p
}

// run runs the script for osName ("Linux" or "Darwin") and returns its
// output, the calls made to the fakes, and its error.
func (in *installer) run(osName string, args ...string) (string, []string, error) {
	in.t.Helper()
	os.Remove(in.calls)
	cmd := exec.Command("sh", append([]string{filepath.Join(in.root, "scripts/install.sh")}, args...)...)
	running := "no"
	if in.running {
		running = "yes"
	}
	cmd.Env = append(os.Environ(), "HEFT_INSTALL_UNAME="+osName, "FAKE_CALLS="+in.calls, "FAKE_RUNNING="+running,
		"PATH="+in.fakes+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	calls, _ := os.ReadFile(in.calls)
	return string(out), strings.Split(strings.TrimSpace(string(calls)), "\n"), err
}

func (in *installer) mustRun(osName string, args ...string) (string, []string) {
	in.t.Helper()
	out, calls, err := in.run(osName, args...)
	if err != nil {
		in.t.Fatalf("install.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out, calls
}

// tree is every file under dir with its mode and content, to show that a
// failed run changed nothing.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		content := ""
		if !d.IsDir() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			content = string(b)
		}
		files[strings.TrimPrefix(p, dir)] = info.Mode().String() + " " + content
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return files
}

type agentTOML struct {
	Listen      string
	Coordinator struct {
		URL       string `toml:"url"`
		TokenFile string `toml:"token_file"`
	}
	Node   struct{ Name string }
	Engine []struct {
		Kind, URL, Log, Model string
		AdvertiseURL          string `toml:"advertise_url"`
	}
}

func readAgentTOML(t *testing.T, path string) agentTOML {
	t.Helper()
	var cfg agentTOML
	if _, err := toml.DecodeFile(path, &cfg); err != nil {
		t.Fatalf("%s is not TOML: %v", path, err)
	}
	return cfg
}

func TestInstallScript(t *testing.T) {
	in := newInstaller(t)
	for _, osName := range []string{"Linux", "Darwin"} {
		t.Run(osName, func(t *testing.T) {
			prefix := t.TempDir()
			// Both option forms, every log source form, a path-less coordinator URL.
			out, calls := in.mustRun(osName, "--prefix", prefix, "--binary="+in.binary, "--coordinator", "wss://heft.example:7070",
				"--token-file="+in.token, "--node", "gpu-a", "--listen", ":7071", "--discover",
				"--engine", "vllm=http://127.0.0.1:8000,log=/var/log/vllm/server.log,model=Qwen/Qwen3-8B,advertise=http://10.0.0.5:8000",
				"--engine=sglang=http://127.0.0.1:30000,log=journald:sglang.service",
				"--engine", "llamacpp=http://127.0.0.1:8080,log=docker:llama",
				"--engine", "ollama=http://127.0.0.1:11434,log=k8s:ml/ollama-0/ollama",
				"--engine", "mlx=http://127.0.0.1:8081,log=/var/log/mlx/*.log")
			confDir, unit := "etc/heft", "etc/systemd/system/heft-agent.service"
			if osName == "Darwin" {
				confDir, unit = "usr/local/etc/heft", "Library/LaunchDaemons/io.heft.agent.plist"
			}
			for _, f := range []string{"usr/local/bin/heft-agent", confDir + "/agent.toml", confDir + "/agent.token", unit} {
				if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
					t.Errorf("missing %s\n%s", f, out)
				}
			}
			conf := filepath.Join(prefix, confDir, "agent.toml")
			cfg := readAgentTOML(t, conf)
			if cfg.Coordinator.URL != "wss://heft.example:7070/api/v1/agent" || !strings.Contains(out, "using wss://heft.example:7070/api/v1/agent") {
				t.Errorf("a coordinator URL without a path: wrote %q, said:\n%s", cfg.Coordinator.URL, out)
			}
			if cfg.Listen != ":7071" {
				t.Errorf("listen = %q, want :7071 (for a central Prometheus)", cfg.Listen)
			}
			if cfg.Node.Name != "gpu-a" || cfg.Coordinator.TokenFile != "/"+confDir+"/agent.token" || len(cfg.Engine) != 5 {
				t.Errorf("config = %+v", cfg)
			}
			wantLogs := []string{"/var/log/vllm/server.log", "journald:sglang.service", "docker:llama", "k8s:ml/ollama-0/ollama", "/var/log/mlx/*.log"}
			for i, e := range cfg.Engine {
				if e.Log != wantLogs[i] {
					t.Errorf("engine %d log = %q, want %q", i, e.Log, wantLogs[i])
				}
			}
			if cfg.Engine[0].Model != "Qwen/Qwen3-8B" || cfg.Engine[0].Kind != "vllm" || cfg.Engine[0].URL != "http://127.0.0.1:8000" ||
				cfg.Engine[0].AdvertiseURL != "http://10.0.0.5:8000" {
				t.Errorf("engine 0 = %+v", cfg.Engine[0])
			}
			// The agent's own config loader accepts what the script wrote.
			ac, err := config.Load(conf, nil, func(k string) string {
				if k == "HEFT_TOKEN_FILE" {
					return filepath.Join(prefix, confDir, "agent.token")
				}
				return ""
			})
			if err != nil {
				t.Fatalf("the agent cannot load the written config: %v", err)
			}
			if err := ac.Validate(); err != nil {
				t.Errorf("the agent rejects the written config: %v", err)
			}
			if !ac.Discover {
				t.Error("--discover did not write discover = true")
			}
			st, _ := os.Stat(filepath.Join(prefix, confDir, "agent.token"))
			if st != nil && st.Mode().Perm()&0o077 != 0 {
				t.Errorf("token file mode %v is readable by others", st.Mode().Perm())
			}
			if !strings.Contains(out, "not started") || calls[0] != "" {
				t.Errorf("a --prefix install should start nothing; calls %q:\n%s", calls, out)
			}
		})
	}
}

func TestInstallScriptKindsAreTheAgents(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "scripts/install.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^kinds="([^"]*)"$`).FindSubmatch(script)
	if m == nil {
		t.Fatal(`install.sh has no kinds="..." line`)
	}
	if got := strings.Fields(string(m[1])); !slices.Equal(got, wire.EngineKinds) {
		t.Errorf("install.sh knows kinds %q, the agent %q", got, wire.EngineKinds)
	}
}

// TestInstallScriptBadInputChangesNothing runs each mistake twice: on an
// empty prefix (nothing may be created) and over an installed agent
// (nothing may change).
func TestInstallScriptBadInputChangesNothing(t *testing.T) {
	in := newInstaller(t)
	good := []string{"--coordinator", "ws://127.0.0.1:7070/api/v1/agent", "--token-file", in.token}
	kinds := "(want one of: " + strings.Join(wire.EngineKinds, " ") + ")"
	failures := []struct {
		name string
		os   string
		args []string
		says string
	}{
		{"unknown OS", "Plan9", good, "unsupported operating system 'Plan9'"},
		{"http url", "Linux", []string{"--coordinator", "http://x", "--token-file", in.token}, "ws:// or wss://"},
		{"url without host", "Linux", []string{"--coordinator", "ws://:7070", "--token-file", in.token}, "has no host"},
		{"missing token", "Linux", []string{"--coordinator", "ws://x/a", "--token-file", filepath.Join(in.tmp, "nope")}, "cannot read token file"},
		{"empty token", "Linux", []string{"--coordinator", "ws://x/a", "--token-file", in.file("empty", "\n", 0o600)}, "is empty"},
		{"bad flag", "Linux", append([]string{"--frobnicate"}, good...), "unknown flag --frobnicate"},
		{"flag without value", "Linux", append(slices.Clone(good), "--node"), "--node needs a value"},
		{"empty value", "Linux", append(slices.Clone(good), "--engine="), "--engine needs a value"},
		{"value on a switch", "Linux", append(slices.Clone(good), "--no-start=yes"), "--no-start takes no value"},
		{"unknown engine kind", "Linux", append(slices.Clone(good), "--engine", "tgi=http://127.0.0.1:8080"), "unknown engine kind 'tgi' " + kinds},
		{"engine without url", "Linux", append(slices.Clone(good), "--engine", "vllm"), "want KIND=URL"},
		{"engine url scheme", "Linux", append(slices.Clone(good), "--engine", "vllm=127.0.0.1:8000"), "must start with http:// or https://"},
		{"engine option", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,logs=/a"), "unknown option 'logs' (want log, model or advertise)"},
		{"advertise without scheme", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,advertise=10.0.0.5:8000"), "advertise '10.0.0.5:8000' must start with http://"},
		{"engine option without value", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,log"), "'log' is not key=value"},
		{"trailing comma", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,"), "an empty option"},
		{"relative log", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,log=server.log"), "log 'server.log' is not an absolute path"},
		{"k8s log", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,log=k8s:ns/pod"), "wants NAMESPACE/POD/CONTAINER"},
		{"journald without unit", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,log=journald:"), "does not name a systemd unit"},
		{"empty model", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1,model="), "model is empty"},
		{"quote in node", "Linux", append(slices.Clone(good), "--node", `gpu"a`), `cannot contain ", \ or a line break`},
		{"space in node", "Linux", append(slices.Clone(good), "--node", "gpu a"), "--node 'gpu a': use ASCII letters"},
		{"node starting with a dash", "Linux", append(slices.Clone(good), "--node", "-gpu"), "not starting with '.' or '-'"},
		{"newline in engine", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1\n[coordinator]"), "cannot contain"},
		{"listen without port", "Linux", append(slices.Clone(good), "--listen", "7071"), "--listen '7071': want HOST:PORT"},
		{"listen port", "Linux", append(slices.Clone(good), "--listen", ":70710"), "port 70710 is not 0..65535"},
		{"not executable", "Linux", append(slices.Clone(good), "--binary", in.token), "is not an executable file"},
		// The second --engine is bad: the first must not have been written.
		{"second engine bad", "Linux", append(slices.Clone(good), "--engine", "vllm=http://x:1", "--engine", "nope=http://y:1"), "unknown engine kind 'nope'"},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			for _, installed := range []bool{false, true} {
				prefix := filepath.Join(t.TempDir(), "root")
				if installed {
					in.mustRun("Linux", "--prefix", prefix, "--binary", in.binary, "--coordinator", "ws://127.0.0.1:7070/api/v1/agent", "--token-file", in.token)
				}
				before := tree(t, prefix)
				args := append([]string{"--prefix", prefix, "--binary", in.binary}, f.args...)
				out, calls, err := in.run(f.os, args...)
				if err == nil {
					t.Fatalf("succeeded:\n%s", out)
				}
				if !strings.Contains(out, f.says) {
					t.Errorf("output %q does not say %q", out, f.says)
				}
				if after := tree(t, prefix); !reflectEqual(before, after) {
					t.Errorf("a failed run changed the install (installed before: %v):\nbefore %v\nafter  %v", installed, keys(before), keys(after))
				}
				if calls[0] != "" {
					t.Errorf("a failed run called %q", calls)
				}
			}
		})
	}
}

func reflectEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestInstallScriptKeepsExistingConfig(t *testing.T) {
	in := newInstaller(t)
	prefix := t.TempDir()
	in.mustRun("Linux", "--prefix", prefix, "--binary", in.binary, "--coordinator", "ws://a:7070/api/v1/agent",
		"--token-file", in.token, "--node", "gpu-a")
	conf := filepath.Join(prefix, "etc/heft/agent.toml")
	token := filepath.Join(prefix, "etc/heft/agent.token")
	// The admin edits the config; an upgrade keeps the edit.
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("# edited by the admin\n")
	f.Close()
	edited, _ := os.ReadFile(conf)

	t.Run("binary only", func(t *testing.T) {
		newer := in.file("heft-agent-2", "#!/bin/sh\necho heft-agent v2\n", 0o755)
		out, _ := in.mustRun("Linux", "--prefix", prefix, "--binary", newer)
		if b, _ := os.ReadFile(conf); string(b) != string(edited) {
			t.Errorf("config changed:\n%s", b)
		}
		if b, _ := os.ReadFile(filepath.Join(prefix, "usr/local/bin/heft-agent")); !strings.Contains(string(b), "v2") {
			t.Errorf("binary not replaced: %s", b)
		}
		if !strings.Contains(out, "kept "+conf) {
			t.Errorf("output does not say the config was kept:\n%s", out)
		}
		if _, err := os.Stat(conf + ".new"); err == nil {
			t.Error("agent.toml.new written though no setting was given")
		}
	})

	t.Run("new settings", func(t *testing.T) {
		otherToken := in.file("token2", "rotated\n", 0o600)
		out, _ := in.mustRun("Linux", "--prefix", prefix, "--binary", in.binary, "--coordinator", "wss://b:7070/api/v1/agent",
			"--token-file", otherToken, "--node", "gpu-b", "--engine", "vllm=http://127.0.0.1:8000")
		if b, _ := os.ReadFile(conf); string(b) != string(edited) {
			t.Errorf("config changed:\n%s", b)
		}
		next := readAgentTOML(t, conf+".new")
		if next.Coordinator.URL != "wss://b:7070/api/v1/agent" || next.Node.Name != "gpu-b" || len(next.Engine) != 1 ||
			next.Coordinator.TokenFile != "/etc/heft/agent.token" {
			t.Errorf("agent.toml.new = %+v", next)
		}
		if !strings.Contains(out, "kept "+conf) || !strings.Contains(out, conf+".new") {
			t.Errorf("output does not say where the new settings went:\n%s", out)
		}
		if b, _ := os.ReadFile(token); string(b) != "s3cret\n" {
			t.Errorf("token replaced: %q", b)
		}
		if b, _ := os.ReadFile(token + ".new"); string(b) != "rotated\n" || !strings.Contains(out, token+".new") {
			t.Errorf("agent.token.new = %q; output:\n%s", b, out)
		}
	})

	t.Run("settings without a coordinator", func(t *testing.T) {
		before := tree(t, prefix)
		out, _, err := in.run("Linux", "--prefix", prefix, "--binary", in.binary, "--node", "gpu-c")
		if err == nil || !strings.Contains(out, "give --coordinator too") {
			t.Errorf("a partial agent.toml.new was allowed: %v\n%s", err, out)
		}
		if !reflectEqual(before, tree(t, prefix)) {
			t.Error("the refused run changed the install")
		}
	})
}

// TestInstallScriptStartsAndRestarts drives the service paths with a fake
// systemctl and launchctl on PATH (--start lifts --prefix's no-start).
func TestInstallScriptStartsAndRestarts(t *testing.T) {
	in := newInstaller(t)
	args := func(prefix string, more ...string) []string {
		return append([]string{"--prefix", prefix, "--binary", in.binary, "--coordinator", "ws://a:7070/api/v1/agent",
			"--token-file", in.token}, more...)
	}
	tests := []struct {
		os      string
		running bool
		says    string
		calls   func(prefix string) []string
	}{
		{"Linux", false, "started heft-agent", func(string) []string {
			return []string{"systemctl is-active --quiet heft-agent.service", "systemctl daemon-reload", "systemctl enable --now heft-agent.service"}
		}},
		{"Linux", true, "restarted heft-agent", func(string) []string {
			return []string{"systemctl is-active --quiet heft-agent.service", "systemctl daemon-reload", "systemctl restart heft-agent.service"}
		}},
		{"Darwin", false, "started heft-agent", func(p string) []string {
			return []string{"launchctl print system/io.heft.agent", "launchctl bootstrap system " + p + "/Library/LaunchDaemons/io.heft.agent.plist"}
		}},
		{"Darwin", true, "restarted heft-agent", func(p string) []string {
			return []string{"launchctl print system/io.heft.agent", "launchctl bootout system/io.heft.agent",
				"launchctl bootstrap system " + p + "/Library/LaunchDaemons/io.heft.agent.plist"}
		}},
	}
	for _, tc := range tests {
		name := tc.os + " stopped"
		if tc.running {
			name = tc.os + " running"
		}
		t.Run(name, func(t *testing.T) {
			prefix := t.TempDir()
			in.running = tc.running
			out, calls := in.mustRun(tc.os, args(prefix, "--start")...)
			if !slices.Equal(calls, tc.calls(prefix)) {
				t.Errorf("calls:\n got %q\nwant %q", calls, tc.calls(prefix))
			}
			if !strings.Contains(out, tc.says) {
				t.Errorf("output does not say %q:\n%s", tc.says, out)
			}
			// An upgrade with --no-start touches no service.
			out, calls = in.mustRun(tc.os, "--prefix", prefix, "--binary", in.binary, "--start", "--no-start")
			if calls[0] != "" || !strings.Contains(out, "not started") {
				t.Errorf("--no-start called %q:\n%s", calls, out)
			}
		})
	}
}

// TestInstallScriptLogSpecs: install.sh accepts exactly the log sources the
// agent's own parser accepts, except relative paths, which it refuses on
// purpose (a service's working directory is no place for a log).
func TestInstallScriptLogSpecs(t *testing.T) {
	in := newInstaller(t)
	specs := []string{
		"/var/log/vllm/server.log", "/var/log/vllm/*.log", "/var/log/vllm/server-[0-9].log", "/var/*/server.log", "file:/var/log/x.log",
		"/srv/a:b.log", "server.log", "file:server.log", "./server.log",
		"journald:vllm", "journald:vllm.service", "journald:vllm@1.service", "journald:", "journald:a b",
		"docker:vllm", "docker:/vllm", "docker:3f2a9c", "docker:", "docker:_vllm", "docker:a/b",
		"k8s:inference/vllm-0/vllm", "kubernetes:inference/vllm-0/vllm", "k8s:inference/vllm-*/vllm", "k8s:inference/vllm-[ab]/vllm",
		"k8s:Inference/vllm-0/vllm", "k8s:inference/vllm_0/vllm", "k8s:inference/vllm-0", "k8s:a/b/c/d", "k8s:inference/vllm-0/Vllm", "k8s:",
		"journal:vllm", "s3:bucket/key",
	}
	for _, spec := range specs {
		s, parseErr := logsource.Parse(spec)
		want := parseErr == nil && (s.Kind != logsource.KindFile && s.Kind != logsource.KindGlob || filepath.IsAbs(s.Path))
		out, _, err := in.run("Linux", "--prefix", t.TempDir(), "--binary", in.binary, "--coordinator", "ws://a:7070/api/v1/agent",
			"--token-file", in.token, "--engine", "vllm=http://127.0.0.1:8000,log="+spec)
		if got := err == nil; got != want {
			t.Errorf("log %q: install.sh accepts it: %v; the agent's parser: %v (%v)\n%s", spec, got, parseErr == nil, parseErr, out)
		}
	}
}

// --help prints the script's header comment and nothing of its code.
func TestInstallScriptHelp(t *testing.T) {
	out := run(t, "", nil, "sh", filepath.Join(testutil.RepoRoot(t), "scripts/install.sh"), "--help")
	if strings.Contains(out, "set -eu") || strings.Contains(out, "prog=") {
		t.Errorf("--help shows code:\n%s", out)
	}
	for _, want := range []string{"--coordinator", "--listen HOST:PORT", "--discover writes", "--start."} {
		if !strings.Contains(out, want) {
			t.Errorf("--help does not say %q:\n%s", want, out)
		}
	}
}
