package gwproc

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestChildTitles(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	if ppid, err := parentOf(os.Getpid()); err != nil || ppid != os.Getppid() {
		t.Fatalf("parentOf(self) = %d, %v; want %d", ppid, err, os.Getppid())
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	titles, err := childTitles(os.Getpid())
	if err != nil || !slices.Contains(titles, "sleep 30") {
		t.Fatalf("childTitles(self) = %q, %v; want one to be \"sleep 30\"", titles, err)
	}
}
