package logsource

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"heft/agent/logfollow"
	"heft/agent/logwrap"
)

// dockerContainer is what heft reads of GET /containers/{id}/json (and
// of the container's config.v2.json on disk, which has the same names).
type dockerContainer struct {
	ID    string `json:"Id"`
	Name  string `json:"Name"`
	State struct {
		Running   bool      `json:"Running"`
		StartedAt time.Time `json:"StartedAt"`
	} `json:"State"`
	Config struct {
		Tty bool `json:"Tty"`
	} `json:"Config"`
	LogPath    string `json:"LogPath"`
	HostConfig struct {
		LogConfig struct {
			Type string `json:"Type"`
		} `json:"LogConfig"`
	} `json:"HostConfig"`
}

func (c dockerContainer) describe() string {
	id := c.ID
	if len(id) > 12 {
		id = id[:12]
	}
	return fmt.Sprintf("container %s (%s), started %s", strings.TrimPrefix(c.Name, "/"), id, c.State.StartedAt.UTC().Format(time.RFC3339))
}

// errDockerUnreachable wraps a failure to reach the API's socket at all.
var errDockerUnreachable = errors.New("the Docker API cannot be reached")

// dockerAPI talks to the Docker Engine API over its unix socket.
type dockerAPI struct {
	socket string
	client *http.Client
}

func newDockerAPI(socket string) *dockerAPI {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}
	return &dockerAPI{socket: socket, client: &http.Client{Transport: &http.Transport{DialContext: dial, DisableCompression: true}}}
}

func (d *dockerAPI) close() { d.client.CloseIdleConnections() }

// get sends GET path (unversioned: the daemon's own API version) and
// returns the response when its status is 200.
func (d *dockerAPI) get(ctx context.Context, path string, query url.Values) (*http.Response, error) {
	u := "http://docker" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w at %s: %v", errDockerUnreachable, d.socket, op.Err)
		}
		return nil, fmt.Errorf("docker api %s: %w", d.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var msg struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &msg) != nil || msg.Message == "" {
			msg.Message = strings.TrimSpace(string(body))
		}
		return nil, &dockerStatusError{code: resp.StatusCode, msg: msg.Message}
	}
	return resp, nil
}

type dockerStatusError struct {
	code int
	msg  string
}

func (e *dockerStatusError) Error() string {
	return fmt.Sprintf("docker api: %d %s: %s", e.code, http.StatusText(e.code), e.msg)
}

// inspectTimeout bounds one inspect call.
const inspectTimeout = 10 * time.Second

func (d *dockerAPI) inspect(ctx context.Context, name string) (dockerContainer, error) {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	resp, err := d.get(ctx, "/containers/"+url.PathEscape(name)+"/json", nil)
	if err != nil {
		var se *dockerStatusError
		if errors.As(err, &se) && se.code == http.StatusNotFound {
			return dockerContainer{}, fmt.Errorf("docker: no container %q (%s)", name, se.msg)
		}
		return dockerContainer{}, err
	}
	defer resp.Body.Close()
	var c dockerContainer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&c); err != nil {
		return dockerContainer{}, fmt.Errorf("docker api: inspect %s: %w", name, err)
	}
	if c.ID == "" {
		return dockerContainer{}, fmt.Errorf("docker api: inspect %s: no Id in the answer", name)
	}
	return c, nil
}

// logs opens the container's log stream from since. With timestamps each
// message starts with its time, so a dropped stream resumes where it was.
func (d *dockerAPI) logs(ctx context.Context, id string, since time.Time, follow bool) (io.ReadCloser, error) {
	q := url.Values{"stdout": {"1"}, "stderr": {"1"}, "timestamps": {"1"}}
	if follow {
		q.Set("follow", "1")
	}
	if !since.IsZero() {
		q.Set("since", fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()))
	}
	resp, err := d.get(ctx, "/containers/"+url.PathEscape(id)+"/logs", q)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Stream types of the multiplexed log stream's frame headers.
const (
	streamStdout   = 1
	streamStderr   = 2
	streamSystemer = 3 // the daemon's own error, in-band
)

// maxFrame bounds one frame's payload kept; Docker's frames hold one log
// message, which its drivers split at 16 KiB.
const maxFrame = 1 << 20

// demux reads Docker's multiplexed stream: frames of an 8-byte header
// (stream type, three zero bytes, big-endian uint32 length) and the
// payload, which may arrive split across reads. fn gets each frame whole.
func demux(r io.Reader, fn func(stream byte, payload []byte)) error {
	var head [8]byte
	buf := make([]byte, 0, 32<<10)
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("docker log stream: frame header: %w", err)
		}
		if head[1] != 0 || head[2] != 0 || head[3] != 0 || head[0] > streamSystemer {
			return fmt.Errorf("docker log stream: bad frame header % x (a TTY container's raw stream read as multiplexed?)", head)
		}
		size := int64(binary.BigEndian.Uint32(head[4:]))
		keep := min(size, maxFrame)
		buf = slices.Grow(buf[:0], int(keep))[:keep] // a frame may outgrow the last
		if _, err := io.ReadFull(r, buf); err != nil {
			return fmt.Errorf("docker log stream: frame of %d bytes: %w", size, err)
		}
		if size > keep {
			if _, err := io.CopyN(io.Discard, r, size-keep); err != nil {
				return fmt.Errorf("docker log stream: frame of %d bytes: %w", size, err)
			}
		}
		if head[0] == streamSystemer {
			return fmt.Errorf("docker log stream: the daemon says: %s", bytes.TrimSpace(buf))
		}
		fn(head[0], buf)
	}
}

// dockerLines turns log messages, each starting with its time stamp, into
// lines: a message without "\n" (Docker split a long line) is joined with
// the next of its stream. Lines stamped at or before skipTo were read
// before a dropped stream was resumed.
type dockerLines struct {
	emit    func(string)
	pending map[byte][]byte
	last    time.Time // the stamp of the last message read
	skipTo  time.Time
}

func newDockerLines(emit func(string)) *dockerLines {
	return &dockerLines{emit: emit, pending: map[byte][]byte{}}
}

// message reads one message (a frame's payload, or a raw stream's line
// with its "\n").
func (l *dockerLines) message(stream byte, msg []byte) {
	if stamp, rest, ok := bytes.Cut(msg, []byte{' '}); ok {
		if t, err := time.Parse(time.RFC3339Nano, string(stamp)); err == nil {
			if !l.skipTo.IsZero() && !t.After(l.skipTo) {
				return
			}
			l.last, msg = t, rest
		}
	}
	for len(msg) > 0 {
		i := bytes.IndexByte(msg, '\n')
		if i < 0 {
			p := l.pending[stream]
			if room := MaxLineBytes - len(p); room > 0 {
				l.pending[stream] = append(p, msg[:min(room, len(msg))]...)
			}
			return
		}
		line := append(l.pending[stream], msg[:i]...)
		l.pending[stream] = line[:0]
		l.emit(strings.TrimSuffix(string(line[:min(len(line), MaxLineBytes)]), "\r"))
		msg = msg[i+1:]
	}
}

// flush emits the streams' unterminated lines.
func (l *dockerLines) flush() {
	for _, stream := range []byte{streamStdout, streamStderr} {
		if p := l.pending[stream]; len(p) > 0 {
			l.emit(strings.TrimSuffix(string(p), "\r"))
		}
		delete(l.pending, stream)
	}
}

// readStream reads one logs response to its end.
func (l *dockerLines) readStream(body io.Reader, tty bool) error {
	if !tty {
		return demux(body, l.message)
	}
	// A TTY's stream is raw: messages as the terminal wrote them, one per
	// line ("\r\n"), each after its stamp.
	err := logfollow.ReadLines(body, MaxLineBytes, func(line string) { l.message(streamStdout, []byte(line+"\n")) })
	if err != nil {
		return fmt.Errorf("docker log stream: %w", err)
	}
	return nil
}

// readDocker reads the container's current run through the API, or its
// json-file on disk when the API's socket cannot be reached.
func (s *Source) readDocker(ctx context.Context, h Handler, follow bool) error {
	api := newDockerAPI(s.opts.DockerSocket)
	defer api.close()
	name := s.spec.Container
	c, err := api.inspect(ctx, name)
	if errors.Is(err, errDockerUnreachable) {
		return s.readDockerFile(ctx, h, follow, err)
	}
	if err != nil {
		return err
	}
	if t := c.HostConfig.LogConfig.Type; t != "" && t != "json-file" && t != "local" && t != "journald" {
		// Only these drivers can be read back; the API's own error says so
		// too, but this one names the fix.
		return fmt.Errorf("docker: container %s logs with the %q driver, which cannot be read back; use json-file or local (or journald, and a journald: source)", name, t)
	}
	via := "docker api " + s.opts.DockerSocket
	if c.Config.Tty {
		via += " (tty: raw stream)"
	}
	lines := newDockerLines(h.Line)
	if !follow {
		s.resolved(c.describe(), via)
		s.newRun()
		body, err := api.logs(ctx, c.ID, c.State.StartedAt, false)
		if err != nil {
			return err
		}
		defer body.Close()
		err = lines.readStream(body, c.Config.Tty)
		lines.flush()
		return err
	}
	run := c
	s.resolved(c.describe(), via)
	s.newRun()
	since := run.State.StartedAt
	for {
		body, err := api.logs(ctx, run.ID, since, true)
		if err == nil {
			err = lines.readStream(body, run.Config.Tty)
			body.Close()
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.recordError(err)
		}
		// The stream ended: the container stopped, or the daemon went
		// away. Wait for the same run to be back, or for a new one.
		for {
			if !sleep(ctx, s.opts.Rescan/4) {
				return nil
			}
			now, err := api.inspect(ctx, name)
			if err != nil {
				s.recordError(err)
				if !sleep(ctx, s.opts.Rescan) {
					return nil
				}
				continue
			}
			if now.ID != run.ID || !now.State.StartedAt.Equal(run.State.StartedAt) {
				lines.flush()
				lines.skipTo = time.Time{}
				h.reset(ReasonRestarted)
				s.logger.Info("the engine's container started again; reading its new run", "container", now.describe())
				run, since = now, now.State.StartedAt
				s.resolved(run.describe(), via)
				s.newRun()
				break
			}
			if now.State.Running {
				// The same run: resume after the last message read.
				if !lines.last.IsZero() {
					since, lines.skipTo = lines.last, lines.last
				}
				break
			}
		}
	}
}

// recordError keeps a passing error in Status without ending the read.
func (s *Source) recordError(err error) {
	s.mu.Lock()
	s.status.LastError, s.status.LastErrorAt = err.Error(), time.Now()
	s.mu.Unlock()
	s.logger.Debug("engine log source", "error", err)
}

// dockerHostConfig is what heft reads of a container's hostconfig.json.
type dockerHostConfig struct {
	LogConfig struct {
		Type string `json:"Type"`
	} `json:"LogConfig"`
}

// findDockerContainer looks through DockerRoot/containers/*/config.v2.json
// for the container by name, full ID or unique ID prefix. That folder is
// root's alone on a stock install: without the API this works for an
// agent running as root (or with the folder mounted for it) only.
func findDockerContainer(root, name string) (dockerContainer, error) {
	dir := filepath.Join(root, "containers")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return dockerContainer{}, err
	}
	var found []dockerContainer
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		// The name is only inside the file: every container's is read.
		id := e.Name()
		b, err := os.ReadFile(filepath.Join(dir, id, "config.v2.json"))
		if err != nil {
			continue
		}
		var c dockerContainer
		if err := json.Unmarshal(b, &c); err != nil {
			continue
		}
		if c.ID == "" {
			c.ID = id
		}
		if c.Name == "/"+name || c.ID == name {
			return withHostConfig(dir, c), nil
		}
		if strings.HasPrefix(c.ID, name) {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 0:
		return dockerContainer{}, fmt.Errorf("no container named %q or with that ID in %s", name, dir)
	case 1:
		return withHostConfig(dir, found[0]), nil
	}
	ids := make([]string, len(found))
	for i, c := range found {
		ids[i] = c.ID[:min(12, len(c.ID))]
	}
	slices.Sort(ids)
	return dockerContainer{}, fmt.Errorf("%q is the start of several container IDs (%s)", name, strings.Join(ids, ", "))
}

func withHostConfig(dir string, c dockerContainer) dockerContainer {
	if b, err := os.ReadFile(filepath.Join(dir, c.ID, "hostconfig.json")); err == nil {
		var hc dockerHostConfig
		if json.Unmarshal(b, &hc) == nil {
			c.HostConfig.LogConfig.Type = hc.LogConfig.Type
		}
	}
	return c
}

// readDockerFile reads the container's json-file log directly: its
// rotated files (ID-json.log.N, .N.gz; the highest N is the oldest) and
// the live one, keeping only lines stamped since the container's current
// start. Docker writes the file across restarts, so a later start shows
// in the file as the engine's next start-up.
func (s *Source) readDockerFile(ctx context.Context, h Handler, follow bool, apiErr error) error {
	c, err := findDockerContainer(s.opts.DockerRoot, s.spec.Container)
	if err != nil {
		return fmt.Errorf("docker: %v; reading the container's log file instead failed too: %w (run the agent as root, or in the docker group for the API)", apiErr, err)
	}
	if t := c.HostConfig.LogConfig.Type; t != "" && t != "json-file" {
		return fmt.Errorf("docker: %v, and container %s logs with the %q driver, whose files heft does not read (only json-file)", apiErr, s.spec.Container, t)
	}
	path := filepath.Join(s.opts.DockerRoot, "containers", c.ID, c.ID+"-json.log")
	s.resolved(c.describe()+", "+path, "docker json-file")
	s.note("the Docker API cannot be reached (%v): reading the json-file directly", apiErr)
	s.newRun()
	u := s.unwrapper(h, logwrap.Options{Since: c.State.StartedAt})
	for _, rotated := range dockerRotated(path) {
		f, err := os.Open(rotated)
		if err != nil {
			s.note("rotated log %s could not be read: %v", rotated, err)
			continue
		}
		if err := readLinesFrom(rotated, f, u.Line); err != nil {
			s.note("rotated log %s could not be read whole: %v", rotated, err)
		}
		f.Close()
	}
	if !follow {
		return readWholeFile(path, u)
	}
	err = logfollow.Follow(ctx, path, logfollow.Options{
		Poll: s.opts.Poll, DeletedGrace: s.opts.deletedGrace, OnDeleted: s.deleted(path),
		OnReset: func(reason string) {
			// Docker renames the file when it rotates it: the same run goes on.
			if reason != logfollow.ReasonReplaced {
				u.Flush()
				h.reset(reason)
			}
		},
	}, u.Line)
	u.Flush()
	return err
}

// dockerRotated lists a json-file's rotated files, oldest first.
func dockerRotated(path string) []string {
	matches, _ := filepath.Glob(path + ".*")
	type rotated struct {
		path string
		n    int
	}
	var out []rotated
	for _, m := range matches {
		suffix := strings.TrimSuffix(strings.TrimPrefix(m, path+"."), ".gz")
		if n, err := strconv.Atoi(suffix); err == nil && n > 0 {
			out = append(out, rotated{m, n})
		}
	}
	slices.SortFunc(out, func(a, b rotated) int { return b.n - a.n })
	paths := make([]string, len(out))
	for i, r := range out {
		paths[i] = r.path
	}
	return paths
}
