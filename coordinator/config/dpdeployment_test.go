package config

import (
	"slices"
	"strings"
	"testing"

	"heft/coordinator/fleet"
)

// [[dp_deployment]] binds a multi-node deployment's address to its nodes:
// from the file, or from a flag or the environment in HOST:PORT=NODE,...
// (entries separated by ';'), a higher layer replacing the file's tables.
func TestDPDeploymentsLoad(t *testing.T) {
	path := writeFile(t, "c.toml", `agent_token = "a-0123456789abcdef0123456789abcdef"
[[dp_deployment]]
address = "10.0.0.1:13345"
nodes = ["gpu-a", "gpu-b"]

[[dp_deployment]]
address = "[fd00::1]:5000"
nodes = ["sg-0"]
`, 0o600)
	cfg, err := Load(path, nil, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []fleet.DeploymentBinding{{Address: "10.0.0.1:13345", Nodes: []string{"gpu-a", "gpu-b"}}, {Address: "[fd00::1]:5000", Nodes: []string{"sg-0"}}}
	if !slices.EqualFunc(cfg.DPDeployments, want, sameBinding) {
		t.Fatalf("file: %+v", cfg.DPDeployments)
	}

	cfg, err = Load(path, nil, envMap(map[string]string{"HEFT_COORDINATOR_DP_DEPLOYMENT": "10.0.0.2:13345=gpu-c, gpu-d; h.example:29550=gpu-e"}))
	if err != nil {
		t.Fatal(err)
	}
	want = []fleet.DeploymentBinding{{Address: "10.0.0.2:13345", Nodes: []string{"gpu-c", "gpu-d"}}, {Address: "h.example:29550", Nodes: []string{"gpu-e"}}}
	if !slices.EqualFunc(cfg.DPDeployments, want, sameBinding) {
		t.Fatalf("environment: %+v", cfg.DPDeployments)
	}

	cfg, err = Load(path, []string{"--dp-deployment", "10.0.0.3:1=gpu-f", "--dp-deployment=10.0.0.4:2=gpu-g,gpu-h"}, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	want = []fleet.DeploymentBinding{{Address: "10.0.0.3:1", Nodes: []string{"gpu-f"}}, {Address: "10.0.0.4:2", Nodes: []string{"gpu-g", "gpu-h"}}}
	if !slices.EqualFunc(cfg.DPDeployments, want, sameBinding) {
		t.Fatalf("flags: %+v", cfg.DPDeployments)
	}
	if cfg, err := Load("", nil, envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": "a-0123456789abcdef0123456789abcdef"})); err != nil || cfg.DPDeployments != nil {
		t.Fatalf("none configured: %+v %v", cfg.DPDeployments, err)
	}
}

func sameBinding(a, b fleet.DeploymentBinding) bool {
	return a.Address == b.Address && slices.Equal(a.Nodes, b.Nodes)
}

// Each mistake stops the start (exit 78) with a message naming the table
// and what is wrong; all are reported at once.
func TestDPDeploymentsValidated(t *testing.T) {
	for _, c := range []struct {
		name, toml string
		want       []string
	}{
		{"no port", `address = "10.0.0.1"
nodes = ["gpu-a"]`, []string{`dp_deployment 1 ("10.0.0.1")`, "not HOST:PORT"}},
		{"bad port", `address = "10.0.0.1:0"
nodes = ["gpu-a"]`, []string{"port \"0\""}},
		{"bad host", `address = "unix:80"
nodes = ["gpu-a"]`, []string{"unix"}},
		{"v6 without brackets", `address = "fd00::1:5000"
nodes = ["gpu-a"]`, []string{"not HOST:PORT"}},
		{"empty nodes", `address = "10.0.0.1:13345"
nodes = []`, []string{"nodes is empty"}},
		{"nodes missing", `address = "10.0.0.1:13345"`, []string{"nodes is empty"}},
		{"bad node name", `address = "10.0.0.1:13345"
nodes = ["gpu a", "-gpu"]`, []string{`node name "gpu a" holds " "`, `"-gpu" starts with "-"`}},
		{"empty node name", `address = "10.0.0.1:13345"
nodes = [""]`, []string{"node name is empty"}},
		{"node twice", `address = "10.0.0.1:13345"
nodes = ["gpu-a", "gpu-b", "gpu-a"]`, []string{`node "gpu-a" is listed twice`}},
		{"address twice", `address = "10.0.0.1:13345"
nodes = ["gpu-a"]
[[dp_deployment]]
address = "10.0.0.1:13345"
nodes = ["gpu-b"]`, []string{`dp_deployment 2 ("10.0.0.1:13345"): the address is bound twice`}},
		{"address twice, spelt otherwise", `address = "[::ffff:10.0.0.1]:13345"
nodes = ["gpu-a"]
[[dp_deployment]]
address = "10.0.0.1:13345"
nodes = ["gpu-b"]`, []string{"bound twice (also as \"[::ffff:10.0.0.1]:13345\")"}},
		{"name twice, case", `address = "Head.Example:13345"
nodes = ["gpu-a"]
[[dp_deployment]]
address = "head.example.:13345"
nodes = ["gpu-b"]`, []string{"bound twice"}},
		{"one table", "", []string{"[dp_deployment] is one table"}},
		{"unknown key", `address = "10.0.0.1:13345"
nodes = ["gpu-a"]
node = "gpu-b"`, []string{"unknown keys: dp_deployment.node"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := "agent_token = \"a-0123456789abcdef0123456789abcdef\"\n[[dp_deployment]]\n" + c.toml + "\n"
			if c.toml == "" {
				body = "agent_token = \"a-0123456789abcdef0123456789abcdef\"\n[dp_deployment]\naddress = \"10.0.0.1:1\"\nnodes = [\"a\"]\n"
			}
			_, err := Load(writeFile(t, "c.toml", body, 0o600), nil, envMap(nil))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
	// From the environment: an entry without '=' says the syntax.
	token := map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": "a-0123456789abcdef0123456789abcdef"}
	_, err := Load("", nil, envMap(map[string]string{"HEFT_COORDINATOR_AGENT_TOKEN": token["HEFT_COORDINATOR_AGENT_TOKEN"], "HEFT_COORDINATOR_DP_DEPLOYMENT": "10.0.0.1:13345"}))
	if err == nil || !strings.Contains(err.Error(), fleet.DeploymentBindingSyntax) {
		t.Fatalf("environment without nodes: %v", err)
	}
	_, err = Load("", []string{"--dp-deployment", "10.0.0.1:13345="}, envMap(token))
	if err == nil || !strings.Contains(err.Error(), "node name is empty") {
		t.Fatalf("flag with no node: %v", err)
	}
}
