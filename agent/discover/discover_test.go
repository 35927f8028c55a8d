package discover

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

func TestURLHost(t *testing.T) {
	for ip, want := range map[string]string{
		"0.0.0.0": "127.0.0.1", "::": "127.0.0.1", "127.0.0.1": "127.0.0.1", "127.0.0.2": "127.0.0.1",
		"::1": "::1", "10.1.2.3": "10.1.2.3", "::ffff:10.1.2.3": "10.1.2.3", "fd00::7": "fd00::7",
	} {
		if got, ok := urlHost(ip); !ok || got != want {
			t.Errorf("urlHost(%q) = %q, %v; want %q", ip, got, ok, want)
		}
	}
	if _, ok := urlHost("not-an-ip"); ok {
		t.Error("urlHost accepted a non-address")
	}
}

func TestFromCgroup(t *testing.T) {
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		line   string
		socket bool
		want   string
	}{
		{"0::/system.slice/vllm.service", true, "journald:vllm.service"},
		{"0::/system.slice/vllm.service", false, ""}, // output not to the journal
		{"0::/user.slice/user-1000.slice/session-3.scope", true, ""},
		{"0::/system.slice/docker-" + id + ".scope", false, "docker:0123456789ab"},
		{"12:memory:/docker/" + id, false, "docker:0123456789ab"},
		{"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + id + ".scope", true, ""},
		{"garbage", true, ""},
	} {
		if got := fromCgroup(tc.line, tc.socket); got != tc.want {
			t.Errorf("fromCgroup(%q, %v) = %q, want %q", tc.line, tc.socket, got, tc.want)
		}
	}
}

func TestIsLogFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "engine.log")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for target, want := range map[string]bool{
		f: true, "/dev/null": false, "pipe:[1234]": false, "socket:[99]": false, "/dev/pts/0": false,
		f + " (deleted)": false, filepath.Dir(f): false, filepath.Join(filepath.Dir(f), "gone.log"): false,
	} {
		if got := isLogFile(target); got != want {
			t.Errorf("isLogFile(%q) = %v, want %v", target, got, want)
		}
	}
}

// TestFindKeepsOnlyWhatKeepAccepts: a search that keeps no process
// reports nothing, whatever runs on this host.
func TestFindKeepsOnlyWhatKeepAccepts(t *testing.T) {
	found, _, err := Find(context.Background(), Options{Keep: func(int) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 0 {
		t.Errorf("found %+v", found)
	}
}
