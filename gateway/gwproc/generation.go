package gwproc

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// WaitNginxOneGeneration waits until nginx's master has exactly the
// workers of one configuration: NginxWorkerProcesses worker
// processes, none of them shutting down. After a reload the master starts
// new workers and then signals the old ones, which keep accepting
// connections until they handle the signal. An old worker retitles itself
// "... is shutting down" a moment before it closes its listening sockets,
// so only its exit says it can take no more; with no request in flight it
// exits at once. Called once a request has been answered by the new
// configuration, it returns when no worker of the old one can take the
// next request. Where /proc cannot be read (not Linux) it cannot tell, and
// does not wait.
func WaitNginxOneGeneration(ctx context.Context, master int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		titles, err := childTitles(master)
		if err != nil {
			return nil
		}
		workers := 0
		for _, t := range titles {
			if strings.HasPrefix(t, "nginx: worker process") {
				workers++
			}
		}
		if workers == NginxWorkerProcesses {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("nginx (pid %d) still had %d workers after %v: %q", master, workers, limit, titles)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childTitles is the command line, as the process shows it now, of every
// child of pid (nginx rewrites its own to name each process's role).
func childTitles(pid int) ([]string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var titles []string
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, err := parentOf(n); err != nil || ppid != pid {
			continue // gone since the listing, or not a child
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		titles = append(titles, strings.TrimRight(strings.ReplaceAll(string(cmd), "\x00", " "), " "))
	}
	return titles, nil
}

// parentOf reads the parent pid from /proc/pid/stat, whose second field (the
// name, in parentheses) may itself hold spaces and parentheses.
func parentOf(pid int) (int, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no name", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(fields[1])
}
