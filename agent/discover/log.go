package discover

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
)

// LogOf returns the log source of the engine whose root process is pid,
// "" when none is found: the file its standard output or error is
// redirected to (vLLM logs to stdout, the others to stderr: that one is
// tried first), else, when that output goes to a socket, the journal of
// the systemd service or the Docker container the process runs in.
func LogOf(pid int, kind string) string {
	fds := []int{2, 1}
	if kind == "vllm" {
		fds = []int{1, 2}
	}
	socket := false
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
		if err != nil {
			continue
		}
		if strings.HasPrefix(target, "socket:") {
			socket = true
		}
		if isLogFile(target) {
			return target
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if src := fromCgroup(sc.Text(), socket); src != "" {
			return src
		}
	}
	return ""
}

// isLogFile reports whether an output descriptor's target is a regular
// file the agent can follow: not a terminal, pipe, socket, /dev/null or a
// deleted file.
func isLogFile(target string) bool {
	if !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "/dev/") || strings.HasSuffix(target, " (deleted)") {
		return false
	}
	st, err := os.Stat(target)
	return err == nil && st.Mode().IsRegular()
}

// dockerIDRE is a container ID in a cgroup path: /docker/ID (cgroup v1)
// or docker-ID.scope (systemd's cgroup driver).
var dockerIDRE = regexp.MustCompile(`(?:/docker/|/docker-)([0-9a-f]{64})(?:\.scope)?$`)

// fromCgroup reads one line of /proc/PID/cgroup ("0::/system.slice/x.service")
// as a log source: a Docker container's log, or a system service's journal
// when its output goes to a socket (journald's stream).
func fromCgroup(line string, socket bool) string {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 {
		return ""
	}
	p := parts[2]
	if m := dockerIDRE.FindStringSubmatch(p); m != nil {
		return "docker:" + m[1][:12]
	}
	if !socket || !strings.HasPrefix(p, "/system.slice/") {
		return ""
	}
	if unit := path.Base(p); strings.HasSuffix(unit, ".service") && strings.Count(p, "/") == 2 {
		return "journald:" + unit
	}
	return ""
}
