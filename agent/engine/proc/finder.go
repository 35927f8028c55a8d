package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

// Recheck is how long a Finder trusts a lookup while its process lives;
// Forget, or a process that exited, makes the next Find look afresh. A
// lookup walks every process's file descriptors (about 70 ms of CPU on a
// small host), so this sets most of the agent's idle CPU.
const Recheck = 60 * time.Second

// Process is an engine's processes as a Finder found them.
type Process struct {
	Root int      // the engine's root process (see EngineRoot)
	Argv []string // Root's command line
	Tree []int    // Root and all its descendants, Root first
}

// Finder finds the engine listening on one port and keeps what it found.
// It is safe for concurrent use.
type Finder struct {
	port     int
	isEngine func(argv []string) bool

	mu       sync.Mutex
	listener int // last listener pid found
	at       time.Time
	last     Process
	err      error
}

// NewFinder returns a Finder for the engine on port; isEngine tells an
// engine's command line from a forwarder's or a process title.
func NewFinder(port int, isEngine func(argv []string) bool) *Finder {
	return &Finder{port: port, isEngine: isEngine}
}

// Find returns the engine's processes. A lookup is reused for Recheck
// while its root process lives, and a failed one for as long, except that
// a lookup that found nothing listening is made again as soon as a socket
// listens on the port (a cheap read of the listening sockets): an engine
// restarted with the same command line is found at once, not as another
// worker for up to Recheck.
func (f *Finder) Find(ctx context.Context) (Process, error) {
	f.mu.Lock()
	p, err, at := f.last, f.err, f.at
	f.mu.Unlock()
	if !at.IsZero() && time.Since(at) < Recheck && (err != nil || alive(p.Root)) && !(errors.Is(err, ErrNoListener) && f.listening(ctx)) {
		return p, err
	}
	p, err = f.lookup(ctx)
	f.mu.Lock()
	f.last, f.err, f.at = p, err, time.Now()
	f.mu.Unlock()
	return p, err
}

// listening reports whether a socket listens on the Finder's port now.
func (f *Finder) listening(ctx context.Context) bool {
	addrs, err := ListenAddrs(ctx, f.port)
	return err == nil && len(addrs) > 0
}

// Forget drops the cached lookup, so a restarted engine's new process
// (and launch arguments) is found at the next Find.
func (f *Finder) Forget() {
	f.mu.Lock()
	f.at, f.last, f.err = time.Time{}, Process{}, nil
	f.mu.Unlock()
}

func (f *Finder) lookup(ctx context.Context) (Process, error) {
	f.mu.Lock()
	listener := f.listener
	f.mu.Unlock()
	if listener == 0 || !stillListens(ctx, listener, f.port) {
		var err error
		listener, err = FindListener(ctx, f.port)
		if err != nil {
			f.mu.Lock()
			f.listener = 0
			f.mu.Unlock()
			return Process{}, err
		}
	}
	root, argv, err := EngineRoot(ctx, listener, f.isEngine)
	if err != nil {
		return Process{}, err
	}
	tree, err := Tree(ctx, root)
	if err != nil {
		return Process{}, err
	}
	f.mu.Lock()
	f.listener = listener
	f.mu.Unlock()
	return Process{Root: root, Argv: argv, Tree: tree}, nil
}

// alive reports whether pid still exists (kill 0 would need permission
// over it; its /proc entry does not).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil || runtime.GOOS != "linux"
}
