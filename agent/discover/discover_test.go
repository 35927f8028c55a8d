package discover

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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

func TestPodLog(t *testing.T) {
	uid := "0b6c7f4e-1d2a-4c3b-9e8f-112233445566"
	for line, want := range map[string]string{
		"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-ab12.scope": uid,
		"0::/kubepods/besteffort/pod" + uid + "/ab12cd": uid,
		"0::/system.slice/vllm.service":                 "",
		"0::/kubepods.slice/kubepods-besteffort.slice":  "",
	} {
		if got := podUID(line); got != want {
			t.Errorf("podUID(%q) = %q, want %q", line, got, want)
		}
	}

	root := t.TempDir()
	one := filepath.Join(root, "inference_vllm-7d9f-x2k4_"+uid, "vllm")
	if err := os.MkdirAll(one, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := podLog(root, uid); got != "k8s:inference/vllm-7d9f-x2k4/vllm" {
		t.Errorf("podLog = %q", got)
	}
	if got := podLog(root, "ffffffff-1d2a-4c3b-9e8f-112233445566"); got != "" {
		t.Errorf("another pod: %q", got)
	}
	// Two containers: which one is the engine is not known.
	if err := os.MkdirAll(filepath.Join(filepath.Dir(one), "sidecar"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := podLog(root, uid); got != "" {
		t.Errorf("a pod of two containers: %q, want none", got)
	}
}
