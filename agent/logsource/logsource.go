// Package logsource reads an engine's log where it really is: a file (or
// the newest file a glob matches), a systemd unit's journal, a Docker
// container's log, or a Kubernetes container's log under /var/log/pods.
//
// A source is named by a spec (the agent config's `log = ...`, and --log
// on pools and inspect):
//
//	/var/log/vllm/server.log        a file
//	/var/log/vllm/*.log             the newest matching file, re-checked so a newer one takes over
//	journald:vllm                   the unit vllm.service, through journalctl
//	docker:vllm                     the container vllm, through the Docker Engine API
//	k8s:NAMESPACE/POD/CONTAINER     /var/log/pods/NAMESPACE_POD_UID/CONTAINER/N.log
//	k8s:inference/vllm-*/vllm       the newest matching pod's (a Deployment's pods change names)
//
// Every source gives the engine's own lines (wrappers taken off by
// agent/logwrap where a file holds them) from the start of the engine's
// current run: the newest invocation of the unit, the container's current
// start, the container's current restart with its rotated files. Follow
// then keeps reading, and calls Handler.Reset when what follows is
// another run or another file; ReadAll reads to the current end once.
// Status says where a source reads from, how, and what went wrong.
package logsource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/logwrap"
)

// Kinds of source.
const (
	KindFile     = "file"
	KindGlob     = "glob"
	KindJournald = "journald"
	KindDocker   = "docker"
	KindK8s      = "k8s"
)

// Reasons passed to Handler.Reset, besides logfollow's "truncated" and
// "replaced" for files.
const (
	// ReasonRestarted: the engine started again (a new invocation of the
	// unit, a new start of the container, a new container of the pod).
	ReasonRestarted = "restarted"
	// ReasonNewerFile: a newer file matches the glob and is read instead.
	ReasonNewerFile = "newer file"
)

// Spec is a parsed source spec.
type Spec struct {
	Kind string
	// Path is the file or glob (KindFile, KindGlob).
	Path string
	// Unit is the systemd unit with its type suffix, "vllm.service".
	Unit string
	// Namespace and Pod name a Kubernetes pod; Container the container
	// in it, or (KindDocker) the Docker container's name or ID.
	Namespace, Pod, Container string
}

// String writes the spec back in its canonical form.
func (s Spec) String() string {
	switch s.Kind {
	case KindJournald:
		return "journald:" + s.Unit
	case KindDocker:
		return "docker:" + s.Container
	case KindK8s:
		return "k8s:" + s.Namespace + "/" + s.Pod + "/" + s.Container
	}
	return s.Path
}

// ErrBadSpec is wrapped by Parse's errors.
var ErrBadSpec = errors.New("bad log source")

// Usage lists the spec forms, for error messages and help text.
const Usage = "a file path, a glob (/var/log/vllm/*.log: the newest match), journald:UNIT, docker:CONTAINER or k8s:NAMESPACE/POD/CONTAINER (POD may be a pattern: vllm-*)"

var (
	// A Kubernetes name: namespaces and containers are DNS labels, pods
	// DNS subdomains; none holds "_" or "/", which the pod folder's name
	// and the spec use as separators.
	k8sLabelRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	k8sSubdomainRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	// A pod name pattern: those characters and glob syntax.
	k8sPodPatternRE = regexp.MustCompile(`^[a-z0-9.*?\[\]^!-]{1,253}$`)
	// Docker's container names; an ID is hex, which this also admits.
	dockerNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	// systemd's unit name characters.
	unitRE = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]+$`)
	// schemeRE is what looks like "kind:" at the start of a spec.
	schemeRE = regexp.MustCompile(`^([a-z][a-z0-9]*):`)
)

// unitTypes are the unit suffixes systemd knows; a name without one is a
// service, as systemctl assumes.
var unitTypes = []string{".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path", ".timer", ".slice", ".scope"}

// Parse reads a spec. A relative path is kept as given.
func Parse(spec string) (Spec, error) {
	s := strings.TrimSpace(spec)
	bad := func(format string, a ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%w %q: %s", ErrBadSpec, spec, fmt.Sprintf(format, a...))
	}
	if s == "" {
		return bad("empty; give %s", Usage)
	}
	if m := schemeRE.FindStringSubmatch(s); m != nil {
		rest := s[len(m[0]):]
		switch m[1] {
		case "journald":
			if rest == "" {
				return bad("journald: needs a unit, as in journald:vllm.service")
			}
			if !unitRE.MatchString(rest) {
				return bad("%q is not a systemd unit name (letters, digits and :_.@-\\ only)", rest)
			}
			unit := rest
			if !hasUnitType(unit) {
				unit += ".service"
			}
			return Spec{Kind: KindJournald, Unit: unit}, nil
		case "docker":
			name := strings.TrimPrefix(rest, "/")
			if name == "" {
				return bad("docker: needs a container name or ID, as in docker:vllm")
			}
			if !dockerNameRE.MatchString(name) {
				return bad("%q is not a Docker container name or ID", name)
			}
			return Spec{Kind: KindDocker, Container: name}, nil
		case "k8s", "kubernetes":
			parts := strings.Split(rest, "/")
			if len(parts) != 3 {
				return bad("k8s: needs NAMESPACE/POD/CONTAINER, as in k8s:default/vllm-0/vllm (got %d part(s))", len(parts))
			}
			ns, pod, ctr := parts[0], parts[1], parts[2]
			switch {
			case !k8sLabelRE.MatchString(ns):
				return bad("namespace %q is not a Kubernetes name (lowercase letters, digits and -)", ns)
			case strings.ContainsAny(pod, "*?["):
				// A Deployment's pods change names: vllm-* is the newest
				// matching pod on this node.
				if _, err := path.Match(pod, ""); err != nil || !k8sPodPatternRE.MatchString(pod) {
					return bad("pod pattern %q is not a pattern of Kubernetes names (lowercase letters, digits, - and ., with * ? [])", pod)
				}
			case !k8sSubdomainRE.MatchString(pod):
				return bad("pod %q is not a Kubernetes name (lowercase letters, digits, - and .)", pod)
			case !k8sLabelRE.MatchString(ctr):
				return bad("container %q is not a Kubernetes name (lowercase letters, digits and -)", ctr)
			}
			return Spec{Kind: KindK8s, Namespace: ns, Pod: pod, Container: ctr}, nil
		case "file":
			s = rest
		default:
			// A relative path may hold a colon; a misspelt kind must not
			// become a file that never appears.
			return bad("unknown kind %q; give %s (write ./%s for a relative path holding a colon)", m[1]+":", Usage, s)
		}
	}
	if s == "" {
		return bad("file: needs a path")
	}
	if strings.ContainsAny(s, "*?[") {
		if _, err := filepath.Match(s, ""); err != nil {
			return bad("glob: %v", err)
		}
		if strings.ContainsAny(filepath.Dir(s), "*?[") {
			// Only the file name may be a pattern: the newest of several
			// folders' files is rarely what was meant, and it is slow.
			return bad("only the file name may hold *, ? or [ (the folder must be a plain path)")
		}
		return Spec{Kind: KindGlob, Path: s}, nil
	}
	return Spec{Kind: KindFile, Path: s}, nil
}

func hasUnitType(unit string) bool {
	for _, t := range unitTypes {
		if strings.HasSuffix(unit, t) && len(unit) > len(t) {
			return true
		}
	}
	return false
}

// Options tune sources. The zero value reads the host's usual places.
type Options struct {
	// Poll is how often a followed file is checked once read to its end
	// (logfollow's default when 0).
	Poll time.Duration
	// Rescan is how often a glob, a pod's log folder, or a stopped
	// container is looked at again for a newer file or run. Default 2s.
	Rescan time.Duration

	// Journalctl is the journalctl binary; "journalctl" from PATH when
	// empty.
	Journalctl string
	// JournalDirectory makes journalctl read the journal files in this
	// folder (--directory) instead of the system journal: a journal
	// mounted into a container, or a test's.
	JournalDirectory string

	// DockerSocket is the Docker Engine API's unix socket;
	// /var/run/docker.sock when empty.
	DockerSocket string
	// DockerRoot is Docker's data root, read directly when the socket
	// cannot be; /var/lib/docker when empty.
	DockerRoot string

	// PodsRoot holds the kubelet's pod logs; /var/log/pods when empty.
	PodsRoot string

	// Test hooks: logfollow's DeletedGrace; after each rotated file read,
	// before a pod log is followed, after each look for a newer file or
	// run, for each new unwrapper.
	deletedGrace time.Duration
	afterRotated func(path string)
	beforeFollow func()
	rescanned    func()
	newUnwrapper func(*logwrap.Unwrapper)
}

const defaultRescan = 2 * time.Second

// The host's usual places, which a zero Options reads.
const (
	DefaultDockerSocket = "/var/run/docker.sock"
	DefaultDockerRoot   = "/var/lib/docker"
	DefaultPodsRoot     = "/var/log/pods"
)

func (o Options) withDefaults() Options {
	if o.Rescan <= 0 {
		o.Rescan = defaultRescan
	}
	if o.Journalctl == "" {
		o.Journalctl = "journalctl"
	}
	if o.DockerSocket == "" {
		o.DockerSocket = DefaultDockerSocket
	}
	if o.DockerRoot == "" {
		o.DockerRoot = DefaultDockerRoot
	}
	if o.PodsRoot == "" {
		o.PodsRoot = DefaultPodsRoot
	}
	return o
}

// Handler receives what a source reads, from the goroutine that called
// Follow or ReadAll.
type Handler struct {
	// Line receives every engine line, in order.
	Line func(line string)
	// Reset, when not nil, is called before the lines of another run
	// (ReasonRestarted) or another file (ReasonNewerFile, and logfollow's
	// ReasonTruncated and ReasonReplaced for a plain file).
	Reset func(reason string)
}

func (h Handler) reset(reason string) {
	if h.Reset != nil {
		h.Reset(reason)
	}
}

// Status says where a source reads from and how it is going, for
// heft-agent inspect.
type Status struct {
	Spec string `json:"spec"`
	Kind string `json:"kind"`
	// Resolved is what is read now: a file, a unit's invocation, a
	// container; Via how (e.g. "journalctl --directory /x", "docker api
	// /var/run/docker.sock", "docker json-file").
	Resolved string `json:"resolved,omitempty"`
	Via      string `json:"via,omitempty"`
	// Wrapper is the wrapper the file's lines came in (logwrap's names);
	// empty where the source gives lines without one (journald, the
	// Docker API).
	Wrapper string `json:"wrapper,omitempty"`
	// Lines counts the engine lines delivered; Skipped the wrapped lines
	// dropped, by reason; Runs the runs read (a restart adds one).
	Lines   int64            `json:"lines"`
	Skipped map[string]int64 `json:"skipped,omitempty"`
	Runs    int              `json:"runs,omitempty"`
	// LastProblem is the last line the unwrapper skipped, and why.
	LastProblem string `json:"last_problem,omitempty"`
	// LastLineAt is when the last line was read.
	LastLineAt time.Time `json:"last_line_at,omitzero"`
	// LastError is the last error reading the source, and when; lines
	// read after it (LastLineAt later) mean the source recovered.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Notes explain choices: several files matched, a rotated file that
	// could not be read, a fallback taken.
	Notes []string `json:"notes,omitempty"`
}

// maxNotes bounds Status.Notes; the oldest go first.
const maxNotes = 8

// Source reads one engine's log. Follow and ReadAll may not run at the
// same time; Status may be called at any time.
type Source struct {
	spec   Spec
	opts   Options
	logger hclog.Logger

	mu     sync.Mutex
	status Status
	// wrap is the unwrapper reading now; done holds what the ones before
	// it in this read skipped, so that a crash-looping engine's many runs
	// cost no memory: Status adds the two up.
	wrap *logwrap.Unwrapper
	done unwrapped
}

// unwrapped is what finished unwrappers skipped, folded together.
type unwrapped struct {
	skipped     map[string]int64
	lastProblem string
}

// add folds one unwrapper's counts in.
func (d *unwrapped) add(ws logwrap.Stats) {
	for k, v := range ws.Skipped {
		if d.skipped == nil {
			d.skipped = map[string]int64{}
		}
		d.skipped[k] += v
	}
	if ws.LastProblem != "" {
		d.lastProblem = ws.LastProblem
	}
}

// Open parses spec and returns its source; nothing is read yet.
func Open(spec string, opts Options, logger hclog.Logger) (*Source, error) {
	s, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	return New(s, opts, logger), nil
}

// New returns the source of a parsed spec.
func New(spec Spec, opts Options, logger hclog.Logger) *Source {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Source{
		spec: spec, opts: opts.withDefaults(), logger: logger.Named("logsource").With("log", spec.String()),
		status: Status{Spec: spec.String(), Kind: spec.Kind},
	}
}

// Spec returns the parsed spec.
func (s *Source) Spec() Spec { return s.spec }

// Status returns a copy of the source's status.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Notes = append([]string(nil), st.Notes...)
	all := unwrapped{skipped: maps.Clone(s.done.skipped), lastProblem: s.done.lastProblem}
	if s.wrap != nil {
		ws := s.wrap.Stats()
		st.Wrapper = ws.Wrapper
		if ws.Mixed {
			st.Wrapper += " (mixed with other formats)"
		}
		all.add(ws)
	}
	st.Skipped, st.LastProblem = all.skipped, all.lastProblem
	return st
}

// Follow reads the engine's current run from its start and follows it
// until ctx ends, then returns nil. It returns an error when the source
// cannot be read (no such unit, container or pod; no permission; a
// missing journalctl), and the caller tries again later.
func (s *Source) Follow(ctx context.Context, h Handler) error {
	return s.run(ctx, h, true)
}

// ReadAll reads the engine's current run from its start to the source's
// current end, once, for one-shot commands.
func (s *Source) ReadAll(ctx context.Context, h Handler) error {
	return s.run(ctx, h, false)
}

func (s *Source) run(ctx context.Context, h Handler, follow bool) error {
	s.mu.Lock()
	s.wrap, s.done = nil, unwrapped{}
	s.mu.Unlock()
	counted := Handler{Reset: h.Reset, Line: func(line string) {
		s.mu.Lock()
		s.status.Lines++
		s.status.LastLineAt = time.Now()
		s.mu.Unlock()
		h.Line(line)
	}}
	var err error
	switch s.spec.Kind {
	case KindFile:
		err = s.readFile(ctx, counted, follow)
	case KindGlob:
		err = s.readGlob(ctx, counted, follow)
	case KindJournald:
		err = s.readJournal(ctx, counted, follow)
	case KindDocker:
		err = s.readDocker(ctx, counted, follow)
	case KindK8s:
		err = s.readK8s(ctx, counted, follow)
	default:
		err = fmt.Errorf("%w: unknown kind %q", ErrBadSpec, s.spec.Kind)
	}
	if err != nil && ctx.Err() == nil {
		s.mu.Lock()
		s.status.LastError, s.status.LastErrorAt = err.Error(), time.Now()
		s.mu.Unlock()
		return err
	}
	if follow && ctx.Err() != nil {
		return nil
	}
	return err
}

// unwrapper returns a new unwrapper feeding h, counted in Status. The
// previous one is finished (sources read one run or file at a time), so
// its counts are folded in and it is let go.
func (s *Source) unwrapper(h Handler, opts logwrap.Options) *logwrap.Unwrapper {
	u := logwrap.New(h.Line, opts)
	s.mu.Lock()
	if s.wrap != nil {
		s.done.add(s.wrap.Stats())
	}
	s.wrap = u
	s.mu.Unlock()
	if s.opts.newUnwrapper != nil {
		s.opts.newUnwrapper(u)
	}
	return u
}

// resolved records what is read now and how.
func (s *Source) resolved(what, via string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status.Resolved != what || s.status.Via != via {
		s.logger.Debug("reading engine log", "from", what, "via", via)
	}
	s.status.Resolved, s.status.Via = what, via
}

// deleted returns logfollow's OnDeleted for the file followed at path:
// Status shows the deletion as the last error until a line is read again.
func (s *Source) deleted(path string) func() {
	return func() {
		s.logger.Info("engine log file deleted; closed it, waiting for a new file at its path", "path", path)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.status.LastError, s.status.LastErrorAt = path+" was deleted: closed it, waiting for a new file there", time.Now()
	}
}

// newRun counts a run of the engine read from its start.
func (s *Source) newRun() {
	s.mu.Lock()
	s.status.Runs++
	s.mu.Unlock()
}

// note adds an explanation to Status, once.
func (s *Source) note(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.status.Notes {
		if n == msg {
			return
		}
	}
	if len(s.status.Notes) >= maxNotes {
		s.status.Notes = s.status.Notes[1:]
	}
	s.status.Notes = append(s.status.Notes, msg)
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
