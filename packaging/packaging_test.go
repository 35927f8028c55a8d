// Package packaging holds the service units, packages, images, manifests,
// alert rules and dashboard that install and watch heft; these tests check
// them with the real tools (dpkg-deb, rpm, lintian, rpmlint, systemd-analyze,
// nfpm, promtool) and real parsers.
package packaging

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"heft/agent/config"
	"heft/agent/logsource"
	"heft/shared/settings"
	"heft/shared/testutil"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"
)

// need returns the path of a tool the test cannot do without. .ci/run
// installs them all; a developer without one sees a skip that names it.
func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (.ci/run should have installed it)", tool)
		}
		t.Skipf("%s not installed", tool)
	}
	return p
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// unitKeys reads a systemd unit's Key=Value lines (last one wins, comments dropped).
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: malformed line %q", path, line)
		}
		keys[k] = append(keys[k], v)
	}
	return keys
}

func TestAgentUnitKeepsNVMLAndProcessDiscoveryWorking(t *testing.T) {
	keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-agent.service"))
	if got := keys["PrivateDevices"]; len(got) != 1 || got[0] != "no" {
		t.Errorf("PrivateDevices = %v, want no (it hides /dev/nvidia*)", got)
	}
	for _, banned := range []string{"ProtectClock", "ProtectProc", "ProcSubset", "DevicePolicy", "DeviceAllow"} {
		if v, ok := keys[banned]; ok {
			t.Errorf("%s=%v is set; it breaks NVML or process discovery", banned, v)
		}
	}
	want := map[string]string{"User": "heft", "Restart": "on-failure", "StateDirectory": "heft-agent",
		"NoNewPrivileges": "yes", "ProtectSystem": "strict"}
	for k, v := range want {
		if got := keys[k]; len(got) == 0 || got[len(got)-1] != v {
			t.Errorf("%s = %v, want %s", k, got, v)
		}
	}
	if caps := strings.Join(keys["AmbientCapabilities"], " "); !strings.Contains(caps, "CAP_SYS_PTRACE") || !strings.Contains(caps, "CAP_DAC_READ_SEARCH") {
		t.Errorf("AmbientCapabilities = %q: the agent cannot map another user's port to its process, nor read other users' logs", caps)
	}
}

// TestAgentUnitShowsEngineLogs: the agent reads engine logs wherever the
// README says they may be (files under /tmp, /var/log, /home, Kubernetes'
// and docker's container logs, the journal); no sandboxing setting may hide
// one, because a log the agent cannot see looks like a log that is missing.
func TestAgentUnitShowsEngineLogs(t *testing.T) {
	keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-agent.service"))
	last := func(k string) string {
		if v := keys[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	if v := last("PrivateTmp"); v != "no" {
		t.Errorf("PrivateTmp = %q, want no: a private /tmp hides an engine log under /tmp", v)
	}
	if v := last("ProtectHome"); v != "read-only" && v != "no" && v != "" {
		t.Errorf("ProtectHome = %q hides /home/*/logs; read-only keeps them readable", v)
	}
	if v := last("ProtectSystem"); v != "strict" && v != "full" && v != "yes" && v != "no" && v != "" {
		t.Errorf("ProtectSystem = %q", v)
	}
	// Settings that take paths away: none may cover a log location.
	logPlaces := []string{"/tmp/engine.log", "/var/log/vllm/server.log", "/var/log/pods/ns_pod_uid/c/0.log",
		"/var/lib/docker/containers/abc/abc-json.log", "/var/log/journal/x/system.journal", "/run/log/journal/x",
		"/home/alice/logs/vllm.log", "/run/docker.sock", "/root/vllm.log"}
	for _, k := range []string{"RootDirectory", "RootImage"} {
		if v, ok := keys[k]; ok {
			t.Errorf("%s=%v hides the host's files", k, v)
		}
	}
	if v := last("PrivateUsers"); v != "" && v != "no" {
		t.Errorf("PrivateUsers=%s maps other users' files to nobody", v)
	}
	for _, k := range []string{"InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths"} {
		for _, v := range keys[k] {
			for _, f := range strings.Fields(v) {
				f = strings.TrimLeft(strings.SplitN(f, ":", 2)[0], "-+")
				for _, place := range logPlaces {
					if f == "/" || strings.HasPrefix(place, strings.TrimSuffix(f, "/")+"/") {
						t.Errorf("%s=%s hides %s", k, v, place)
					}
				}
			}
		}
	}
	// The groups that read GPUs and the journal come from the user's
	// membership (postinstall, install.sh): a group named in the unit that
	// the host lacks would stop the unit from starting (status 216/GROUP).
	if v, ok := keys["SupplementaryGroups"]; ok {
		t.Errorf("SupplementaryGroups=%v: a group missing on the host stops the unit", v)
	}
	root := testutil.RepoRoot(t)
	for _, f := range []string{"packaging/scripts/postinstall.sh", "scripts/install.sh"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "for g in video render systemd-journal adm; do") {
			t.Errorf("%s does not give the heft user the video, render, systemd-journal and adm groups", f)
		}
	}
	if families := strings.Join(keys["RestrictAddressFamilies"], " "); !strings.Contains(families, "AF_UNIX") {
		t.Errorf("RestrictAddressFamilies = %q: the journal and docker's socket need AF_UNIX", families)
	}
}

// TestUnitsStopOnConfigErrors: a binary that exits 78 (EX_CONFIG) has a bad
// configuration, which restarting every 5 s cannot fix.
func TestUnitsStopOnConfigErrors(t *testing.T) {
	for _, name := range []string{"heft-agent.service", "heft-coordinator.service", "heft-sync.service"} {
		keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd", name))
		want := strconv.Itoa(settings.ExitConfig)
		if got := keys["RestartPreventExitStatus"]; len(got) != 1 || got[0] != want {
			t.Errorf("%s: RestartPreventExitStatus = %v, want %s (settings.ExitConfig)", name, got, want)
		}
	}
}

func TestCoordinatorUnitIsHardened(t *testing.T) {
	keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-coordinator.service"))
	for k, v := range map[string]string{"User": "heft", "StateDirectory": "heft", "PrivateDevices": "yes",
		"ProtectSystem": "strict", "Restart": "on-failure", "MemoryDenyWriteExecute": "yes"} {
		if got := keys[k]; len(got) == 0 || got[len(got)-1] != v {
			t.Errorf("%s = %v, want %s", k, got, v)
		}
	}
	// The file's state_dir decides, and it names the StateDirectory: a
	// --state-dir in ExecStart would silently beat an operator's edit.
	if strings.Contains(keys["ExecStart"][0], "state-dir") {
		t.Errorf("ExecStart %q passes --state-dir, which beats the file's state_dir", keys["ExecStart"][0])
	}
	var file struct {
		StateDir string `toml:"state_dir"`
	}
	if _, err := toml.DecodeFile(filepath.Join(testutil.RepoRoot(t), "packaging/config/coordinator.toml"), &file); err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/" + keys["StateDirectory"][0]; file.StateDir != want {
		t.Errorf("the packaged coordinator.toml's state_dir = %q, want the unit's StateDirectory %s", file.StateDir, want)
	}
	if docker, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/docker/coordinator.Dockerfile")); err != nil || strings.Contains(string(docker), `"--state-dir"`) {
		t.Errorf("the coordinator image's CMD passes --state-dir (or cannot be read: %v)", err)
	}
}

func TestUnitsVerify(t *testing.T) {
	analyze := need(t, "systemd-analyze")
	root := testutil.RepoRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"heft-agent.service", "heft-coordinator.service", "heft-sync.service", "heft-nginx-check.service"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, "packaging/systemd", name))
			if err != nil {
				t.Fatal(err)
			}
			// verify insists that ExecStart's program exists; point it at one that does.
			text := strings.NewReplacer("/usr/bin/heft-agent", self, "/usr/bin/heft-coordinator", self, "/usr/bin/heft-sync", self,
				"/usr/sbin/nginx", self).Replace(string(data))
			dir := t.TempDir()
			path := filepath.Join(dir, name)
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(analyze, "verify", path)
			cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=warning")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				// Lines about the host's own units are not ours.
				if strings.Contains(line, name) {
					t.Errorf("verify: %s", line)
				}
			}
		})
	}
}

// plistValue is a generic property-list node.
type plistValue struct {
	XMLName xml.Name
	Text    string       `xml:",chardata"`
	Items   []plistValue `xml:",any"`
}

func TestLaunchdPlistParses(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/launchd/io.heft.agent.plist"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName xml.Name   `xml:"plist"`
		Dict    plistValue `xml:"dict"`
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("plist does not parse: %v", err)
	}
	dict := map[string]plistValue{}
	items := doc.Dict.Items
	for i := 0; i+1 < len(items); i += 2 {
		if items[i].XMLName.Local != "key" {
			t.Fatalf("dict entry %d is <%s>, want <key>", i, items[i].XMLName.Local)
		}
		dict[items[i].Text] = items[i+1]
	}
	if dict["Label"].Text != "io.heft.agent" {
		t.Errorf("Label = %q", dict["Label"].Text)
	}
	if dict["UserName"].Text != "root" {
		t.Errorf("UserName = %q, want root (powermetrics needs it)", dict["UserName"].Text)
	}
	var args []string
	for _, a := range dict["ProgramArguments"].Items {
		args = append(args, a.Text)
	}
	if strings.Join(args, " ") != "/usr/local/bin/heft-agent run --config /usr/local/etc/heft/agent.toml" {
		t.Errorf("ProgramArguments = %v", args)
	}
	keep := dict["KeepAlive"].Items
	if len(keep) != 2 || keep[0].Text != "SuccessfulExit" || keep[1].XMLName.Local != "false" {
		t.Errorf("KeepAlive should restart on failure only: %+v", keep)
	}
	if !strings.HasSuffix(dict["StandardErrorPath"].Text, ".log") {
		t.Errorf("no log file: %q", dict["StandardErrorPath"].Text)
	}
}

func TestKubernetesManifests(t *testing.T) {
	root := testutil.RepoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "packaging/kubernetes/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	kinds := map[string]map[string]any{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc map[string]any
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", filepath.Base(f), err)
			}
			kind, _ := doc["kind"].(string)
			api, _ := doc["apiVersion"].(string)
			meta, _ := doc["metadata"].(map[string]any)
			if kind == "" || api == "" || meta["name"] == nil {
				t.Fatalf("%s: a document lacks kind, apiVersion or metadata.name: %v", filepath.Base(f), doc)
			}
			kinds[kind+"/"+meta["name"].(string)] = doc
		}
	}
	for _, want := range []string{"DaemonSet/heft-agent", "Deployment/heft-coordinator", "Service/heft-coordinator",
		"ConfigMap/heft-agent", "ConfigMap/heft-coordinator", "Namespace/heft"} {
		if kinds[want] == nil {
			t.Errorf("missing %s", want)
		}
	}
	ds := kinds["DaemonSet/heft-agent"]
	pod := dig(ds, "spec", "template", "spec").(map[string]any)
	if pod["hostPID"] != true {
		t.Error("the agent DaemonSet needs hostPID for process discovery")
	}
	var hostPaths []string
	for _, v := range pod["volumes"].([]any) {
		if hp, ok := v.(map[string]any)["hostPath"].(map[string]any); ok {
			hostPaths = append(hostPaths, hp["path"].(string))
		}
	}
	if len(hostPaths) == 0 {
		t.Error("no engine log path mounted from the host")
	}
	// Engines log to their pods, read through the node's pod logs, mounted
	// read-only where the agent looks for them.
	podLogs := false
	agentCtr := pod["containers"].([]any)[0].(map[string]any)
	for _, m := range agentCtr["volumeMounts"].([]any) {
		m := m.(map[string]any)
		if m["mountPath"] == logsource.DefaultPodsRoot {
			podLogs = m["readOnly"] == true
			for _, v := range pod["volumes"].([]any) {
				v := v.(map[string]any)
				if v["name"] == m["name"] && dig(v, "hostPath", "path") != logsource.DefaultPodsRoot {
					t.Errorf("%s is mounted from %v, not the node's %s", logsource.DefaultPodsRoot, dig(v, "hostPath", "path"), logsource.DefaultPodsRoot)
				}
			}
		}
	}
	if !podLogs {
		t.Errorf("the agent does not mount the node's %s read-only", logsource.DefaultPodsRoot)
	}
	agentCfg := config.Default()
	if err := agentCfg.Parse(kinds["ConfigMap/heft-agent"]["data"].(map[string]any)["agent.toml"].(string)); err != nil {
		t.Fatalf("the agent's ConfigMap: %v", err)
	}
	// One ConfigMap for every node's engines: they are discovered, each
	// with its pod's log.
	if !agentCfg.Discover {
		t.Error("the agent's ConfigMap does not set discover = true")
	}
	for _, e := range agentCfg.Engines {
		if spec, err := logsource.Parse(e.Log); err != nil || spec.Kind != logsource.KindK8s {
			t.Errorf("the ConfigMap's engine %s logs to %q (%v), want a k8s:NAMESPACE/POD/CONTAINER source", e.URL, e.Log, err)
		}
	}
	// The config maps must hold TOML the binaries accept.
	for _, cm := range []string{"ConfigMap/heft-agent", "ConfigMap/heft-coordinator"} {
		for name, text := range kinds[cm]["data"].(map[string]any) {
			var v map[string]any
			if _, err := toml.Decode(text.(string), &v); err != nil {
				t.Errorf("%s %s is not TOML: %v", cm, name, err)
			}
		}
	}
}

func dig(v any, path ...string) any {
	for _, p := range path {
		v = v.(map[string]any)[p]
	}
	return v
}

func TestDockerfiles(t *testing.T) {
	root := testutil.RepoRoot(t)
	for bin, file := range map[string]string{"heft-agent": "agent.Dockerfile", "heft-coordinator": "coordinator.Dockerfile"} {
		data, err := os.ReadFile(filepath.Join(root, "packaging/docker", file))
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		froms := strings.Count(text, "\nFROM ")
		if froms < 2 || !strings.Contains(text, " AS build") {
			t.Errorf("%s is not a multi-stage build", file)
		}
		if !strings.Contains(text, "./"+strings.Replace(bin, "heft-", "", 1)+"/cmd/"+bin) {
			t.Errorf("%s does not build ./.../cmd/%s", file, bin)
		}
		if !strings.Contains(text, `ENTRYPOINT ["/usr/bin/`+bin+`"]`) {
			t.Errorf("%s has no entrypoint for %s", file, bin)
		}
		// As in the packages: the coordinator static, the agent's NVML through purego.
		if !strings.Contains(text, "CGO_ENABLED=0 go build") {
			t.Errorf("%s does not build %s without cgo", file, bin)
		}
	}
	agent, _ := os.ReadFile(filepath.Join(root, "packaging/docker/agent.Dockerfile"))
	if strings.Contains(string(agent), "libnvidia-ml") && !strings.Contains(string(agent), "not in the image") {
		t.Error("the agent image must not bake in the driver's NVML library")
	}
}

// The agent.toml the packages install loads, with its commented log
// source and [engine_logs] lines taken in too.
func TestShippedAgentConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/config/agent.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	if err := cfg.Parse(string(data)); err != nil {
		t.Fatalf("as shipped: %v", err)
	}
	var uncommented []string
	for _, l := range strings.Split(string(data), "\n") {
		for _, p := range []string{"# log = ", "# [engine_logs]", "# journal_directory", "# docker_", "# pods_root"} {
			if strings.HasPrefix(l, p) {
				l = strings.TrimPrefix(l, "# ")
			}
		}
		uncommented = append(uncommented, l)
	}
	cfg = config.Default()
	if err := cfg.Parse(strings.Join(uncommented, "\n")); err != nil {
		t.Fatalf("with the examples: %v", err)
	}
	if err := cfg.Validate(); err != nil && strings.Contains(err.Error(), "log") {
		t.Errorf("the example log source is refused: %v", err)
	}
	if cfg.Engines[0].Log == "" || cfg.EngineLogs.PodsRoot != logsource.DefaultPodsRoot {
		t.Errorf("examples not read: %+v %+v", cfg.Engines, cfg.EngineLogs)
	}
}
