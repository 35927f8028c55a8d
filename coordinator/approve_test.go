package coordinator

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"heft/coordinator/config"
	"heft/coordinator/store"
)

// approve_new_nodes, when the configuration does not set it, is on for a
// new install and stays on over restarts; a state file from before the
// default (an upgrade) keeps it off; the file or the environment decide
// where they say.
func TestApproveNewNodesFollowsTheInstall(t *testing.T) {
	load := func(t *testing.T, dir, extra string, env map[string]string) config.Config {
		t.Helper()
		path := filepath.Join(t.TempDir(), "coordinator.toml")
		text := fmt.Sprintf("listen = \"127.0.0.1:0\"\nstate_dir = %q\nagent_token = %q\nadmin_token = %q\n%s", dir, agentToken, adminToken, extra)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, nil, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	approves := func(t *testing.T, cfg config.Config) bool {
		t.Helper()
		st, err := store.Open(cfg.StateDir, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		return nodesConfig(cfg, st, testLogger(t)).ApproveNew
	}
	fresh := t.TempDir()
	if !approves(t, load(t, fresh, "", nil)) {
		t.Error("a new install does not approve new node names")
	}
	if !approves(t, load(t, fresh, "", nil)) {
		t.Error("a new install, restarted, no longer approves new node names")
	}
	if approves(t, load(t, fresh, "approve_new_nodes = false\n", nil)) {
		t.Error("approve_new_nodes = false in the file is not obeyed on a new install")
	}
	if approves(t, load(t, fresh, "", map[string]string{"HEFT_COORDINATOR_APPROVE_NEW_NODES": "false"})) {
		t.Error("HEFT_COORDINATOR_APPROVE_NEW_NODES=false is not obeyed")
	}

	upgraded := t.TempDir()
	fixture, err := os.ReadFile(filepath.Join("store", "testdata", "schema1.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upgraded, store.FileName), fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	if approves(t, load(t, upgraded, "", nil)) {
		t.Error("an upgrade (a state file from before the default) approves new node names")
	}
	if !approves(t, load(t, upgraded, "approve_new_nodes = true\n", nil)) {
		t.Error("approve_new_nodes = true is not obeyed on an upgrade")
	}
}
