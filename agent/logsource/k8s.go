package logsource

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/agent/logfollow"
	"heft/agent/logwrap"
)

// The kubelet keeps a container's log at
// /var/log/pods/NAMESPACE_POD_UID/CONTAINER/N.log, N counting the
// container's restarts. It rotates by renaming N.log to
// N.log.YYYYMMDD-hhmmss (the runtime then reopens N.log) and gzips the
// older rotated files (N.log.YYYYMMDD-hhmmss.gz), keeping a few.
var k8sLogRE = regexp.MustCompile(`^(\d+)\.log(?:\.(\d{8}-\d{6}))?(\.gz)?$`)

// k8sTarget is one run of a container: its log folder and restart count.
type k8sTarget struct {
	dir     string
	restart int
}

func (t k8sTarget) live() string { return filepath.Join(t.dir, strconv.Itoa(t.restart)+".log") }

// k8sFile is a rotated file of a run.
type k8sFile struct {
	name, stamp string
	gz          bool
}

// k8sResolve finds the newest run of the container: of the pod's log
// folders (a pod re-created under the same name gets a new UID; a pod
// pattern matches several pods), the one written last, and in it the
// highest restart count.
func (s *Source) k8sResolve() (k8sTarget, error) {
	root, sp := s.opts.PodsRoot, s.spec
	entries, err := os.ReadDir(root)
	if err != nil {
		return k8sTarget{}, fmt.Errorf("k8s: cannot read the pod logs: %w (the agent needs the node's %s, read-only)", err, root)
	}
	var best k8sTarget
	var bestTime time.Time
	pods := 0
	containers := map[string]bool{}
	for _, e := range entries {
		// NAMESPACE_POD_UID: Kubernetes names hold no "_".
		parts := strings.Split(e.Name(), "_")
		if !e.IsDir() || len(parts) != 3 || parts[0] != sp.Namespace || parts[2] == "" {
			continue
		}
		if ok, _ := path.Match(sp.Pod, parts[1]); !ok {
			continue
		}
		pods++
		podDir := filepath.Join(root, e.Name())
		if subs, err := os.ReadDir(podDir); err == nil {
			for _, c := range subs {
				containers[c.Name()] = true
			}
		}
		dir := filepath.Join(podDir, sp.Container)
		files, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		restart, newest := -1, time.Time{}
		for _, f := range files {
			m := k8sLogRE.FindStringSubmatch(f.Name())
			if m == nil {
				continue
			}
			n, err := strconv.Atoi(m[1])
			if err != nil {
				continue
			}
			restart = max(restart, n)
			if info, err := f.Info(); err == nil && info.ModTime().After(newest) {
				newest = info.ModTime()
			}
		}
		if restart < 0 {
			continue
		}
		if best.dir == "" || newest.After(bestTime) {
			best, bestTime = k8sTarget{dir: dir, restart: restart}, newest
		}
	}
	switch {
	case pods == 0:
		return k8sTarget{}, fmt.Errorf("k8s: no folder %s_%s_<uid> under %s: is pod %s/%s on this node?", sp.Namespace, sp.Pod, root, sp.Namespace, sp.Pod)
	case best.dir == "":
		have := slices.Sorted(func(yield func(string) bool) {
			for c := range containers {
				if !yield(c) {
					return
				}
			}
		})
		return k8sTarget{}, fmt.Errorf("k8s: pod %s/%s has no log of container %q under %s (containers with logs: %s)",
			sp.Namespace, sp.Pod, sp.Container, root, strings.Join(have, ", "))
	}
	return best, nil
}

// k8sChain reads a run's rotated files once each, oldest first, however
// they are renamed and compressed while it reads.
type k8sChain struct {
	s      *Source
	target k8sTarget
	u      *logwrap.Unwrapper
	// done holds the stamps of rotated files read (or known to be a file
	// read under another name); infos the files read, to know one again
	// after the kubelet renamed it.
	done  map[string]bool
	infos []os.FileInfo
}

// rotated lists the run's rotated files, oldest first.
func (c *k8sChain) rotated() ([]k8sFile, error) {
	files, err := os.ReadDir(c.target.dir)
	if err != nil {
		return nil, fmt.Errorf("k8s: %w", err)
	}
	var out []k8sFile
	seen := map[string]bool{}
	for _, f := range files {
		m := k8sLogRE.FindStringSubmatch(f.Name())
		if m == nil || m[2] == "" || m[1] != strconv.Itoa(c.target.restart) || seen[m[2]] {
			continue
		}
		seen[m[2]] = true // a file and its .gz a moment before the plain one goes
		out = append(out, k8sFile{name: f.Name(), stamp: m[2], gz: m[3] != ""})
	}
	slices.SortFunc(out, func(a, b k8sFile) int { return strings.Compare(a.stamp, b.stamp) })
	return out, nil
}

// known tells whether info is a file already read (or held, skip).
func (c *k8sChain) known(info, skip os.FileInfo) bool {
	if skip != nil && os.SameFile(info, skip) {
		return true
	}
	for _, r := range c.infos {
		if os.SameFile(info, r) {
			return true
		}
	}
	return false
}

// catchUp reads the rotated files not read yet, oldest first, and says
// how many it read. skip is a file the caller holds and reads itself.
func (c *k8sChain) catchUp(skip os.FileInfo) int {
	files, err := c.rotated()
	if err != nil {
		c.s.note("%v", err)
		return 0
	}
	n := 0
	for _, f := range files {
		if c.done[f.stamp] {
			continue
		}
		c.done[f.stamp] = true
		path := filepath.Join(c.target.dir, f.name)
		file, err := os.Open(path)
		if err != nil {
			c.s.note("rotated log %s could not be read: %v", path, err)
			continue
		}
		info, err := file.Stat()
		if err == nil && !f.gz && c.known(info, skip) {
			file.Close()
			continue
		}
		if err == nil && !f.gz {
			c.infos = append(c.infos, info)
		}
		if err := readLinesFrom(path, file, c.u.Line); err != nil {
			c.s.note("rotated log %s could not be read whole: %v", path, err)
		}
		file.Close()
		n++
		if c.s.opts.afterRotated != nil {
			c.s.opts.afterRotated(path)
		}
	}
	return n
}

// catchUpAll reads rotated files until no new one appears.
func (c *k8sChain) catchUpAll(skip os.FileInfo) {
	for range 8 {
		if c.catchUp(skip) == 0 {
			return
		}
	}
}

// readK8s reads the container's current run: its rotated files, oldest
// first, then N.log; following, across the kubelet's rotation (the same
// run: no reset) and into a new run (a restart's N+1.log, or a new pod of
// the same name) with ReasonRestarted.
func (s *Source) readK8s(ctx context.Context, h Handler, follow bool) error {
	target, err := s.k8sResolve()
	if err != nil {
		return err
	}
	if !follow {
		return s.readK8sOnce(target, h)
	}
	for first := true; ctx.Err() == nil; first = false {
		s.resolved(target.live(), "kubelet pod log folder "+s.opts.PodsRoot)
		if !first {
			h.reset(ReasonRestarted)
		}
		s.newRun()
		c := &k8sChain{s: s, target: target, u: s.unwrapper(h, logwrap.Options{}), done: map[string]bool{}}
		c.catchUpAll(nil)
		if s.opts.beforeFollow != nil {
			s.opts.beforeFollow()
		}
		var next k8sTarget
		lastCheck := time.Now()
		err := logfollow.Follow(ctx, target.live(), logfollow.Options{
			Poll: s.opts.Poll, DeletedGrace: s.opts.deletedGrace, OnDeleted: s.deleted(target.live()),
			OnOpen: func(info os.FileInfo) {
				// A file renamed away just before this open is read first.
				c.catchUpAll(info)
				c.infos = append(c.infos, info)
			},
			OnReset: func(reason string) {
				// A rename is the kubelet's rotation within the run: a
				// partial line may go on in the new file.
				if reason != logfollow.ReasonReplaced {
					c.u.Flush()
					h.reset(reason)
				}
			},
			Stop: func() bool {
				if time.Since(lastCheck) < s.opts.Rescan {
					return false
				}
				lastCheck = time.Now()
				t, err := s.k8sResolve()
				if err != nil || t == target {
					return false
				}
				next = t
				return true
			},
		}, c.u.Line)
		c.u.Flush()
		if err != nil {
			return err
		}
		if next.dir == "" {
			return nil
		}
		s.logger.Info("the engine's container restarted; reading its new log", "from", target.live(), "to", next.live())
		target = next
	}
	return nil
}

// readK8sOnce reads a run to its current end. The live file is opened
// first and held, so a rotation while the rotated files are read cannot
// hide its content; if the live file was rotated meanwhile, the newer
// one is read too.
func (s *Source) readK8sOnce(target k8sTarget, h Handler) error {
	s.resolved(target.live(), "kubelet pod log folder "+s.opts.PodsRoot)
	s.newRun()
	c := &k8sChain{s: s, target: target, u: s.unwrapper(h, logwrap.Options{}), done: map[string]bool{}}
	for range 8 {
		f, err := os.Open(target.live())
		if err != nil && !isNotExist(err) {
			return fmt.Errorf("k8s: %w", err)
		}
		if f == nil {
			// Between a rename and the runtime's reopen: only rotated files.
			c.catchUpAll(nil)
			if len(c.done) == 0 {
				return fmt.Errorf("k8s: %s: no log file yet", target.dir)
			}
			break
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("k8s: %w", err)
		}
		c.catchUpAll(info)
		if !c.known(info, nil) {
			c.infos = append(c.infos, info)
			if err := readLinesFrom(target.live(), f, c.u.Line); err != nil {
				f.Close()
				return fmt.Errorf("k8s: %w", err)
			}
		}
		f.Close()
		if now, err := os.Stat(target.live()); err != nil || os.SameFile(now, info) {
			break
		}
	}
	c.u.Flush()
	return nil
}
