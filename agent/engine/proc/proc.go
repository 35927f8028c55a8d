// Package proc finds an engine's processes on this host from the TCP port
// it listens on: the listener, the engine's root process and its command
// line, and the whole process tree (every process of which may hold GPU
// memory). Finding a port's owner walks every process's file descriptors,
// so a Finder keeps what it found while that process lives.
package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	psnet "github.com/shirou/gopsutil/v4/net"
	"github.com/shirou/gopsutil/v4/process"
)

// ErrNoListener is returned when no other process listens on a port.
var ErrNoListener = errors.New("no process found listening on the port")

// ErrListenerHidden is returned when a socket listens on the port but its
// process cannot be seen (another user's process, without root or
// CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH).
var ErrListenerHidden = errors.New("a process listens on the port but belongs to another user; run the agent as root or grant it CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH")

// FindListener returns the pid of the process listening on a TCP port.
// The agent's own process does not count: engines run in-process in tests,
// and the agent is never its own engine.
func FindListener(ctx context.Context, port int) (int, error) {
	if port <= 0 || port > 65535 {
		return 0, fmt.Errorf("port %d out of range", port)
	}
	conns, err := psnet.ConnectionsWithContext(ctx, "tcp")
	if err != nil {
		return 0, fmt.Errorf("list tcp sockets: %w", err)
	}
	self := os.Getpid()
	hidden := false
	for _, c := range conns {
		if c.Status != "LISTEN" || c.Laddr.Port != uint32(port) {
			continue
		}
		switch {
		case int(c.Pid) == self:
			continue
		case c.Pid <= 0:
			hidden = true
			continue
		}
		return int(c.Pid), nil
	}
	if hidden {
		return 0, ErrListenerHidden
	}
	return 0, ErrNoListener
}

// stillListens checks cheaply whether pid still listens on port, so a
// known engine process is not searched for again on every snapshot.
func stillListens(ctx context.Context, pid, port int) bool {
	conns, err := psnet.ConnectionsPidWithContext(ctx, "tcp", int32(pid))
	if err != nil {
		return false
	}
	for _, c := range conns {
		if c.Status == "LISTEN" && c.Laddr.Port == uint32(port) {
			return true
		}
	}
	return false
}

// Tree returns root and all its descendants, root first. Engines
// spread over processes (vLLM's EngineCore_DPk and workers, SGLang's
// schedulers), and every one of them may hold GPU memory.
func Tree(ctx context.Context, root int) ([]int, error) {
	if root <= 0 {
		return nil, fmt.Errorf("pid %d out of range", root)
	}
	procs, err := process.ProcessesWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	children := map[int][]int{}
	found := false
	for _, p := range procs {
		if int(p.Pid) == root {
			found = true
		}
		ppid, err := p.PpidWithContext(ctx)
		if err != nil || int(ppid) == int(p.Pid) {
			continue // gone since the listing, or pid 0's self-parenting
		}
		children[int(ppid)] = append(children[int(ppid)], int(p.Pid))
	}
	if !found {
		return nil, fmt.Errorf("process %d: %w", root, process.ErrorProcessNotRunning)
	}
	tree := []int{root}
	seen := map[int]bool{root: true}
	for i := 0; i < len(tree); i++ {
		for _, c := range children[tree[i]] {
			if !seen[c] {
				seen[c] = true
				tree = append(tree, c)
			}
		}
	}
	return tree, nil
}

// Cmdline reads a process's argv.
func Cmdline(ctx context.Context, pid int) ([]string, error) {
	p := &process.Process{Pid: int32(pid)}
	argv, err := p.CmdlineSliceWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("read command line of pid %d: %w", pid, err)
	}
	return argv, nil
}

func parentOf(ctx context.Context, pid int) int {
	p := &process.Process{Pid: int32(pid)}
	ppid, err := p.PpidWithContext(ctx)
	if err != nil {
		return 0
	}
	return int(ppid)
}

// EngineRoot finds the engine's root process from its listener: the
// listener itself when isEngine accepts its command line, or else (a
// multiprocessing-spawned API server, a process title) the nearest of its
// four closest ancestors that isEngine accepts. It returns that pid and
// its argv; when there is none, the listener and its argv (which may be a
// port forwarder's, such as docker-proxy: callers check the argv before
// reading launch arguments from it).
func EngineRoot(ctx context.Context, listener int, isEngine func(argv []string) bool) (int, []string, error) {
	argv, err := Cmdline(ctx, listener)
	if err != nil {
		return listener, nil, err
	}
	if isEngine(argv) {
		return listener, argv, nil
	}
	pid := listener
	for range 4 {
		parent := parentOf(ctx, pid)
		if parent <= 1 {
			break
		}
		pargv, err := Cmdline(ctx, parent)
		if err != nil {
			break
		}
		if isEngine(pargv) {
			return parent, pargv, nil
		}
		pid = parent
	}
	return listener, argv, nil
}

// IsLocalHost reports whether host names this machine, so that the
// process listening on the URL's port here is the engine. A remote URL
// must never be matched against a local process that happens to use the
// same port.
func IsLocalHost(host string) bool {
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() || ip.IsUnspecified() {
			return true
		}
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return false
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
		return false
	}
	if h, err := os.Hostname(); err == nil && strings.EqualFold(h, host) {
		return true
	}
	return false
}

// Getenv reads one variable of a process's environment as it was started
// (/proc/PID/environ, readable by the process's user, root, or with
// CAP_SYS_PTRACE). ok is false when the variable is not set.
func Getenv(ctx context.Context, pid int, name string) (value string, ok bool, err error) {
	p := &process.Process{Pid: int32(pid)}
	env, err := p.EnvironWithContext(ctx)
	if err != nil {
		return "", false, fmt.Errorf("read the environment of pid %d: %w", pid, err)
	}
	for _, kv := range env {
		if k, v, found := strings.Cut(kv, "="); found && k == name {
			return v, true, nil
		}
	}
	return "", false, nil
}
