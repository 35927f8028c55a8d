package packaging

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/gateway/config"
	"heft/shared/testutil"
)

// heft-sync runs as heft with no privilege of its own: HAProxy's socket
// through the group haproxy (added by the package, not named in the unit,
// which a missing group would stop), nginx's check and reload through a
// polkit rule, its files in folders it is given.
func TestSyncUnitKeepsNoPrivilege(t *testing.T) {
	keys := unitKeys(t, filepath.Join(testutil.RepoRoot(t), "packaging/systemd/heft-sync.service"))
	for k, v := range map[string]string{"User": "heft", "Group": "heft", "NoNewPrivileges": "yes", "CapabilityBoundingSet": "",
		"ProtectSystem": "strict", "Restart": "on-failure", "MemoryDenyWriteExecute": "yes",
		"ExecStart": "/usr/bin/heft-sync --config /etc/heft/sync.toml"} {
		if got := keys[k]; len(got) == 0 || got[len(got)-1] != v {
			t.Errorf("%s = %v, want %q", k, got, v)
		}
	}
	if g := keys["SupplementaryGroups"]; len(g) != 0 {
		t.Errorf("SupplementaryGroups = %v: a group missing on the host fails the unit (216/GROUP)", g)
	}
	if rw := strings.Join(keys["ReadWritePaths"], " "); !strings.Contains(rw, "-/etc/nginx/heft") || !strings.Contains(rw, "-/etc/litellm/heft") {
		t.Errorf("ReadWritePaths = %q, want the optional nginx and LiteLLM folders", rw)
	}
	if sd := keys["StateDirectory"]; len(sd) == 0 || sd[len(sd)-1] != "heft-sync" {
		t.Errorf("StateDirectory = %v, want heft-sync: the sample config keeps Envoy's state_file under /var/lib/heft-sync", sd)
	}
	if af := strings.Join(keys["RestrictAddressFamilies"], " "); !strings.Contains(af, "AF_UNIX") {
		t.Errorf("RestrictAddressFamilies = %q: HAProxy's socket and systemctl need AF_UNIX", af)
	}
	post, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/scripts/postinstall.sh"))
	if err != nil || !strings.Contains(string(post), "usermod -a -G haproxy heft") {
		t.Errorf("postinstall does not add heft to the group haproxy (%v)", err)
	}
}

// The polkit rule, run by a JavaScript engine as polkit runs it, allows
// the user heft exactly two actions.
func TestPolkitRuleAllowsOnlyTheNginxCheckAndReload(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the polkit rule is not evaluated")
	}
	rule, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/polkit/50-heft-sync.rules"))
	if err != nil {
		t.Fatal(err)
	}
	type ask struct {
		Action string `json:"action"`
		User   string `json:"user"`
		Unit   string `json:"unit"`
		Verb   string `json:"verb"`
	}
	const manage = "org.freedesktop.systemd1.manage-units"
	cases := []struct {
		ask
		allow bool
	}{
		{ask{manage, "heft", "heft-nginx-check.service", "start"}, true},
		{ask{manage, "heft", "nginx.service", "reload"}, true},
		{ask{manage, "heft", "nginx.service", "restart"}, false},
		{ask{manage, "heft", "nginx.service", "stop"}, false},
		{ask{manage, "heft", "nginx.service", "start"}, false},
		{ask{manage, "heft", "heft-nginx-check.service", "stop"}, false},
		{ask{manage, "heft", "haproxy.service", "reload"}, false},
		{ask{manage, "heft", "sshd.service", "reload"}, false},
		{ask{manage, "www-data", "nginx.service", "reload"}, false},
		{ask{"org.freedesktop.systemd1.manage-unit-files", "heft", "nginx.service", "reload"}, false},
		{ask{"org.freedesktop.login1.reboot", "heft", "", ""}, false},
	}
	var asks []ask
	for _, c := range cases {
		asks = append(asks, c.ask)
	}
	data, _ := json.Marshal(asks)
	// polkit's API as rules see it: polkit.addRule, polkit.Result,
	// action.id and action.lookup(key), subject.user.
	script := `const rules = [];
const polkit = { Result: { YES: "yes", NO: "no", NOT_HANDLED: null }, addRule: f => rules.push(f) };
` + string(rule) + `
const out = [];
for (const a of ` + string(data) + `) {
  const action = { id: a.action, lookup: k => ({ unit: a.unit, verb: a.verb })[k] };
  const subject = { user: a.user, isInGroup: () => false };
  let r = null;
  for (const f of rules) { r = f(action, subject); if (r !== null && r !== undefined) break; }
  out.push(r === "yes");
}
console.log(JSON.stringify({ rules: rules.length, out }));`
	path := filepath.Join(t.TempDir(), "check.js")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	outText, err := exec.Command(node, path).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, outText)
	}
	var got struct {
		Rules int    `json:"rules"`
		Out   []bool `json:"out"`
	}
	if err := json.Unmarshal(outText, &got); err != nil || got.Rules != 1 || len(got.Out) != len(cases) {
		t.Fatalf("node said %s (%v)", outText, err)
	}
	for i, c := range cases {
		if got.Out[i] != c.allow {
			t.Errorf("%+v: allowed %v, want %v", c.ask, got.Out[i], c.allow)
		}
	}
}

// The packaged sync.toml loads, and says what is missing (a gateway); its
// example tables, uncommented, make a configuration heft-sync accepts.
func TestSyncConfigExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "packaging/config/sync.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(string(data))
	if err != nil {
		t.Fatalf("the packaged sync.toml does not parse: %v", err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "no gateway") {
		t.Errorf("Validate: %v, want only the missing gateway", err)
	}
	var lines []string
	examples := false
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "# Add at least one gateway table") {
			examples = true
			continue
		}
		if examples && strings.HasPrefix(l, "# ") {
			l = strings.TrimPrefix(l, "# ")
		}
		lines = append(lines, l)
	}
	cfg, err = config.Parse(strings.Join(lines, "\n"))
	if err != nil {
		t.Fatalf("the example tables do not parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the example tables do not validate: %v", err)
	}
	if len(cfg.HAProxy) != 1 || len(cfg.Nginx) != 1 || !slices.Equal(cfg.Nginx[0].Check, []string{"systemctl", "start", "heft-nginx-check.service"}) {
		t.Errorf("examples: %+v", cfg)
	}
}
