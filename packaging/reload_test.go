package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
)

// TestUnitsReloadAsTheDocsSay: every "systemctl reload heft-X" the docs
// tell an operator to run needs an ExecReload in heft-X's unit, or systemd
// refuses it ("Job type reload is not applicable"). The agent's unit had
// none, so the token rotation's second step failed. Each such ExecReload is
// run against a stand-in main process, which must receive SIGHUP (the
// binaries read their token files again on it).
func TestUnitsReloadAsTheDocsSay(t *testing.T) {
	root := testutil.RepoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"))
	units := map[string]bool{}
	reload := regexp.MustCompile(`systemctl reload\s+(heft-[a-z-]+)`)
	for _, d := range docs {
		text, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range reload.FindAllSubmatch(text, -1) {
			units[string(m[1])] = true
		}
	}
	if !units["heft-agent"] || !units["heft-coordinator"] {
		t.Fatalf("the docs' reloads: %v; the token rotation reloads heft-agent and heft-coordinator", units)
	}
	for name := range units {
		keys := unitKeys(t, filepath.Join(root, "packaging/systemd", name+".service"))
		cmds := keys["ExecReload"]
		if len(cmds) != 1 {
			t.Errorf("%s.service: ExecReload = %q, but the docs say `systemctl reload %s`", name, cmds, name)
			continue
		}
		// A stand-in main process that says when SIGHUP reaches it.
		main := exec.Command("sh", "-c", `trap 'echo hup; exit 0' HUP; echo ready; while :; do sleep 0.05; done`)
		var out testutil.SyncBuffer
		main.Stdout = &out
		if err := main.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "ready"); {
			if time.Now().After(deadline) {
				t.Fatal("the stand-in did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
		args := strings.Fields(strings.ReplaceAll(cmds[0], "$MAINPID", strconv.Itoa(main.Process.Pid)))
		if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Errorf("%s.service: ExecReload %q: %v\n%s", name, cmds[0], err, b)
		}
		done := make(chan error, 1)
		go func() { done <- main.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = main.Process.Kill()
			<-done
		}
		if !strings.Contains(out.String(), "hup") {
			t.Errorf("%s.service: ExecReload %q sent no SIGHUP to $MAINPID (stand-in said %q)", name, cmds[0], out.String())
		}
	}
}
