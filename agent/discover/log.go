package discover

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// LogOf returns the log source of the engine whose root process is pid,
// "" when none is found: the file its standard output or error is
// redirected to (vLLM logs to stdout, the others to stderr: that one is
// tried first), else the log of the Kubernetes pod's container (its pod's
// folder under podsRoot, when the pod has one container), the Docker
// container, or (output to a socket) the journal of the systemd service
// the process runs in.
func LogOf(pid int, kind, podsRoot string) string {
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
		if uid := podUID(sc.Text()); uid != "" {
			return podLog(podsRoot, uid)
		}
		if src := fromCgroup(sc.Text(), socket); src != "" {
			return src
		}
	}
	return ""
}

// podUIDRE is a pod's UID in a cgroup path: kubepods-...-pod<UID>.slice
// (systemd's cgroup driver, "_" for "-") or /kubepods/.../pod<UID>/
// (cgroupfs).
var podUIDRE = regexp.MustCompile(`kubepods.*[-/]pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice|/)`)

// podUID returns the UID of the pod a cgroup line places the process in,
// "" for none.
func podUID(line string) string {
	m := podUIDRE.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "_", "-")
}

// podLog is k8s:NAMESPACE/POD/CONTAINER for the pod whose folder under
// podsRoot (NAMESPACE_POD_UID/CONTAINER/) ends in uid, when it holds one
// container: with several, which one the engine is cannot be told from
// the process, and "" says so.
func podLog(podsRoot, uid string) string {
	dirs, err := filepath.Glob(filepath.Join(podsRoot, "*_*_"+uid))
	if err != nil || len(dirs) != 1 {
		return ""
	}
	parts := strings.SplitN(filepath.Base(dirs[0]), "_", 3)
	containers, err := os.ReadDir(dirs[0])
	if err != nil || len(parts) != 3 || len(containers) != 1 || !containers[0].IsDir() {
		return ""
	}
	return "k8s:" + parts[0] + "/" + parts[1] + "/" + containers[0].Name()
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
