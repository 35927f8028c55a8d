package gwtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// StartNginxHosts is StartNginx with host names resolved from a hosts
// file the test controls (SetHosts) instead of the machine's resolver:
// nginx and its check run in a mount namespace of their own where that
// file is /etc/hosts and nsswitch.conf says "hosts: files", so a name
// left out of it fails at once, as in a DNS outage, and nothing of the
// machine's own files changes. It skips the test where the namespace
// cannot be made (not root).
func StartNginxHosts(t testing.TB, conf, upstream, hosts string) *Nginx {
	t.Helper()
	n := newNginx(t)
	hostsFile, nss, ns := filepath.Join(n.Dir, "hosts"), filepath.Join(n.Dir, "nsswitch.conf"), filepath.Join(n.Dir, "ns.sh")
	// A script, not sh -c: the tests join a command's words with spaces.
	// Bind mounts follow the file, not its name: SetHosts writes in place.
	script := "mount --bind " + hostsFile + " /etc/hosts && mount --bind " + nss + ` /etc/nsswitch.conf && exec "$@"` + "\n"
	for path, text := range map[string]string{hostsFile: hosts, nss: "hosts: files\n", ns: script} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n.wrap = []string{"unshare", "-m", "sh", ns}
	if out, err := exec.Command(n.wrap[0], append(n.wrap[1:], "true")...).CombinedOutput(); err != nil {
		t.Skipf("cannot give nginx a hosts file of its own (unshare -m and a bind mount need root): %v %s", err, out)
	}
	return startNginx(t, n, conf, upstream)
}

// SetHosts replaces the hosts file nginx and its check resolve names
// from (StartNginxHosts); a name it no longer holds does not resolve.
func (n *Nginx) SetHosts(hosts string) {
	n.t.Helper()
	// In place, not renamed over: the bind mount holds the file itself.
	if err := os.WriteFile(filepath.Join(n.Dir, "hosts"), []byte(hosts), 0o644); err != nil {
		n.t.Fatal(err)
	}
}
