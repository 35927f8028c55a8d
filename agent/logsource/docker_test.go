package logsource

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
)

// fakeDocker speaks the part of the Docker Engine API heft uses, on a
// unix socket: inspect, and logs in the multiplexed stream format (or raw
// for a TTY), with since, follow and timestamps.
type fakeDocker struct {
	t      *testing.T
	socket string

	mu      sync.Mutex
	c       fakeContainer
	changed chan struct{} // closed and replaced on every change
	// cutAfter, when > 0, ends the next follow stream after that many
	// frames while the container runs: a daemon dropping a client.
	cutAfter int
	queries  []string
}

type fakeContainer struct {
	id, name  string
	tty       bool
	driver    string
	running   bool
	startedAt time.Time
	msgs      []fakeMsg
}

type fakeMsg struct {
	at     time.Time
	stream byte
	text   string // with its "\n", or without for a split line
}

func newFakeDocker(t *testing.T, c fakeContainer) *fakeDocker {
	t.Helper()
	d := &fakeDocker{t: t, c: c, changed: make(chan struct{}), socket: filepath.Join(t.TempDir(), "docker.sock")}
	l, err := net.Listen("unix", d.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containers/{name}/json", d.inspect)
	mux.HandleFunc("GET /containers/{name}/logs", d.logs)
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return d
}

// update changes the container under the lock and wakes followers.
func (d *fakeDocker) update(fn func(c *fakeContainer)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn(&d.c)
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *fakeDocker) inspect(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	c := d.c
	d.mu.Unlock()
	if name := r.PathValue("name"); name != c.name && name != c.id {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"message":"No such container: %s"}`, name)
		return
	}
	var out dockerContainer
	out.ID, out.Name, out.Config.Tty, out.LogPath = c.id, "/"+c.name, c.tty, "/var/lib/docker/containers/"+c.id+"/"+c.id+"-json.log"
	out.State.Running, out.State.StartedAt = c.running, c.startedAt
	out.HostConfig.LogConfig.Type = c.driver
	json.NewEncoder(w).Encode(out)
}

func (d *fakeDocker) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d.mu.Lock()
	d.queries = append(d.queries, q.Encode())
	c := d.c
	d.mu.Unlock()
	if name := r.PathValue("name"); name != c.name && name != c.id {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if q.Get("stdout") != "1" || q.Get("stderr") != "1" || q.Get("timestamps") != "1" {
		http.Error(w, "the test expects stdout, stderr and timestamps", http.StatusBadRequest)
		return
	}
	var since time.Time
	if s := q.Get("since"); s != "" {
		sec, frac, _ := strings.Cut(s, ".")
		secs, err1 := strconv.ParseInt(sec, 10, 64)
		nanos, err2 := strconv.ParseInt(frac, 10, 64)
		if err1 != nil || err2 != nil || len(frac) != 9 {
			http.Error(w, "bad since "+s, http.StatusBadRequest)
			return
		}
		since = time.Unix(secs, nanos)
	}
	if c.tty {
		w.Header().Set("Content-Type", "application/vnd.docker.raw-stream")
	} else {
		w.Header().Set("Content-Type", "application/vnd.docker.multiplexed-stream")
	}
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	sent, frames := 0, 0
	runStart := c.startedAt
	for {
		d.mu.Lock()
		c, changed, cut := d.c, d.changed, d.cutAfter
		d.mu.Unlock()
		if !c.startedAt.Equal(runStart) {
			return // Docker ends a follow stream when its container stops
		}
		for ; sent < len(c.msgs); sent++ {
			m := c.msgs[sent]
			if m.at.Before(since) {
				continue
			}
			payload := []byte(m.at.UTC().Format(time.RFC3339Nano) + " " + m.text)
			if c.tty {
				w.Write(payload)
				flusher.Flush()
				continue
			}
			var head [8]byte
			head[0] = m.stream
			binary.BigEndian.PutUint32(head[4:], uint32(len(payload)))
			// A frame split across reads: part of the header, then the
			// rest of it with a little of the payload, then the rest.
			w.Write(head[:3])
			flusher.Flush()
			k := min(5, len(payload))
			w.Write(append(head[3:], payload[:k]...))
			flusher.Flush()
			w.Write(payload[k:])
			flusher.Flush()
			frames++
			if cut > 0 && frames >= cut {
				d.mu.Lock()
				d.cutAfter = 0
				d.mu.Unlock()
				return
			}
		}
		if q.Get("follow") != "1" || !c.running {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// run makes messages of lines stamped one millisecond apart from start,
// alternating stdout and stderr as wraptest does.
func run(lines []string, start time.Time) []fakeMsg {
	var out []fakeMsg
	for i, l := range lines {
		stream := byte(streamStderr)
		if wraptest.Stream(i) == "stdout" {
			stream = streamStdout
		}
		out = append(out, fakeMsg{at: start.Add(time.Duration(i+1) * time.Millisecond), stream: stream, text: l + "\n"})
	}
	return out
}

// splitLong splits the message holding text into two frames, the first
// without its "\n", as Docker does for a line over 16 KiB.
func splitLong(msgs []fakeMsg, text string) []fakeMsg {
	for i, m := range msgs {
		if strings.Contains(m.text, text) {
			cut := len(m.text) / 2
			first, second := m, m
			first.text, second.text = m.text[:cut], m.text[cut:]
			second.at = m.at.Add(time.Microsecond)
			return slices.Insert(slices.Delete(slices.Clone(msgs), i, i+1), i, first, second)
		}
	}
	panic("splitLong: no message holds " + text)
}

const fakeID = "3f2a9c0d5e6b7a8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c"

func TestDockerFollowAcrossFramesDropsAndRestarts(t *testing.T) {
	t1, t2 := t0, t0.Add(time.Hour)
	first := fixtureLines(t, "engines/vllm-dp2.log")
	msgs := splitLong(run(first, t1), "non-default args")
	d := newFakeDocker(t, fakeContainer{id: fakeID, name: "vllm", driver: "json-file", running: true, startedAt: t1, msgs: msgs})
	d.cutAfter = 7
	src, err := Open("docker:vllm", fast(Options{DockerSocket: d.socket}), logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, "vllm")
	stop := following(t, src, rec.handler())
	testutil.Eventually(t, "the first run's lines", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) >= len(first) })
	if got, _ := rec.got(); !slices.Equal(got, first) {
		t.Fatalf("first run: %d lines, want %d (a dropped stream must resume without repeats)", len(got), len(first))
	}
	if r := rec.ranks(); !slices.Equal(r, ranks(0, 373696, 1, 373552)) {
		t.Fatalf("ranks %v", r)
	}

	// More lines while the container runs.
	d.update(func(c *fakeContainer) {
		c.msgs = append(c.msgs, fakeMsg{at: t1.Add(time.Minute), stream: streamStderr, text: "(APIServer pid=1) INFO 12-11 09:15:05 [loggers.py:236] Engine 000: Avg prompt throughput: 0.0 tokens/s\n"})
	})
	testutil.Eventually(t, "the appended line", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(first)+1 })

	// The container stops and starts again with another log.
	d.update(func(c *fakeContainer) { c.running = false })
	second := fixtureLines(t, "engines/vllm-single.log")
	d.update(func(c *fakeContainer) {
		c.running, c.startedAt = true, t2
		c.msgs = append(c.msgs, run(second, t2)...)
	})
	testutil.Eventually(t, "the second run's pools", 10*time.Second, func() bool { return slices.Equal(rec.ranks(), ranks(0, 379088)) })
	testutil.Eventually(t, "every line of the second run", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(first)+1+len(second) })
	got, resets := rec.got()
	if !slices.Equal(got[len(first)+1:], second) || !slices.Equal(resets, []string{ReasonRestarted}) {
		t.Fatalf("resets %q; second run read as %d lines", resets, len(got)-len(first)-1)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := src.Status()
	if st.Runs != 2 || !strings.Contains(st.Resolved, "container vllm (3f2a9c0d5e6b), started "+t2.Format(time.RFC3339)) || st.Via != "docker api "+d.socket {
		t.Fatalf("status %+v", st)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// The first stream from the run's start, one resumed after the frame
	// read last before the drop (the 7th: the 6th line, whose predecessor
	// Docker split in two), and the second run's from its start.
	if len(d.queries) < 3 {
		t.Fatalf("queries %q", d.queries)
	}
	for i, want := range []string{fmt.Sprintf("since=%d.000000000", t1.Unix()), fmt.Sprintf("since=%d.006000000", t1.Unix())} {
		if !strings.Contains(d.queries[i], want) || !strings.Contains(d.queries[i], "follow=1") {
			t.Fatalf("query %d %q, want %s", i, d.queries[i], want)
		}
	}
	if want := fmt.Sprintf("since=%d.000000000", t2.Unix()); !strings.Contains(d.queries[len(d.queries)-1], want) {
		t.Fatalf("last query %q, want %s", d.queries[len(d.queries)-1], want)
	}
}

func TestDockerReadAllOnlyTheCurrentRun(t *testing.T) {
	t1, t2 := t0, t0.Add(time.Hour)
	msgs := append(run(fixtureLines(t, "engines/vllm-dp2.log"), t1), run(fixtureLines(t, "logs/vllm-restart.log"), t2)...)
	for _, tty := range []bool{false, true} {
		t.Run(map[bool]string{false: "multiplexed", true: "tty"}[tty], func(t *testing.T) {
			m := slices.Clone(msgs)
			if tty {
				for i := range m {
					m[i].text = strings.TrimSuffix(m[i].text, "\n") + "\r\n"
				}
			}
			d := newFakeDocker(t, fakeContainer{id: fakeID, name: "vllm", tty: tty, driver: "json-file", running: false, startedAt: t2, msgs: m})
			rec := newRecorder(t, "vllm")
			src, _ := Open("docker:"+fakeID, fast(Options{DockerSocket: d.socket}), logger(t))
			if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
				t.Fatal(err)
			}
			f, _ := rec.tracker.Facts()
			if !slices.Equal(f.Ranks, ranks(0, 362544)) || f.Restarts != 1 {
				t.Fatalf("facts %+v", f)
			}
			if got, _ := rec.got(); len(got) != len(fixtureLines(t, "logs/vllm-restart.log")) {
				t.Fatalf("read %d lines: an earlier run leaked in", len(got))
			}
		})
	}
}

func TestDockerErrors(t *testing.T) {
	d := newFakeDocker(t, fakeContainer{id: fakeID, name: "vllm", driver: "none", startedAt: t0})
	tests := []struct{ spec, want string }{
		{"docker:nope", `docker: no container "nope" (No such container: nope)`},
		{"docker:vllm", `logs with the "none" driver`},
	}
	for _, tc := range tests {
		src, _ := Open(tc.spec, Options{DockerSocket: d.socket, DockerRoot: t.TempDir()}, nil)
		rec := newRecorder(t, "vllm")
		if err := src.ReadAll(context.Background(), rec.handler()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.spec, err, tc.want)
		}
	}

	// No socket, and Docker's folder cannot be read either.
	src, _ := Open("docker:vllm", Options{DockerSocket: filepath.Join(t.TempDir(), "docker.sock"), DockerRoot: filepath.Join(t.TempDir(), "absent")}, nil)
	err := src.Follow(context.Background(), newRecorder(t, "vllm").handler())
	for _, want := range []string{"the Docker API cannot be reached", "docker.sock", "reading the container's log file instead failed too", "absent/containers"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v lacks %q", err, want)
		}
	}
	if st := src.Status(); !strings.Contains(st.LastError, "cannot be reached") {
		t.Errorf("status %+v", st)
	}
}

// dockerRoot writes a container's folder as dockerd keeps it: its config
// with name, start and TTY, its host config with the log driver, and its
// json-file log with a rotated predecessor.
func dockerRoot(t *testing.T, started time.Time, rotated, live string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "containers", fakeID)
	var cfg dockerContainer
	cfg.ID, cfg.Name, cfg.State.Running, cfg.State.StartedAt = fakeID, "/vllm", true, started
	b, _ := json.Marshal(cfg)
	writeFile(t, filepath.Join(dir, "config.v2.json"), string(b))
	writeFile(t, filepath.Join(dir, "hostconfig.json"), `{"LogConfig":{"Type":"json-file","Config":{}}}`)
	writeFile(t, filepath.Join(dir, fakeID+"-json.log.1"), rotated)
	writeFile(t, filepath.Join(dir, fakeID+"-json.log"), live)
	// Another container is not read.
	writeFile(t, filepath.Join(root, "containers", "0000", "config.v2.json"), `{"ID":"0000","Name":"/other"}`)
	return root
}

// With the socket unreachable, the json-file on disk is read: the current
// run only, its rotated file first.
func TestDockerFallbackToJSONFile(t *testing.T) {
	t1, t2 := t0, t0.Add(time.Hour)
	second := fixtureLines(t, "logs/sglang-restart.log")
	rotated := wraptest.DockerJSON(fixtureLines(t, "engines/sglang-dp2-even.log"), t1, 16<<10) + wraptest.DockerJSON(second[:5], t2, 16<<10)
	live := wraptest.DockerJSON(second[5:], t2.Add(time.Second), 16<<10)
	root := dockerRoot(t, t2, rotated, live)
	noSocket := filepath.Join(t.TempDir(), "docker.sock")
	for _, follow := range []bool{false, true} {
		src, _ := Open("docker:vllm", fast(Options{DockerSocket: noSocket, DockerRoot: root}), logger(t))
		rec := newRecorder(t, "sglang")
		if follow {
			stop := following(t, src, rec.handler())
			testutil.Eventually(t, "the current run", 10*time.Second, func() bool { l, _ := rec.got(); return len(l) == len(second) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		} else if err := src.ReadAll(context.Background(), rec.handler()); err != nil {
			t.Fatal(err)
		}
		got, _ := rec.got()
		f, _ := rec.tracker.Facts()
		if !slices.Equal(got, second) || !slices.Equal(f.Ranks, ranks(0, 24101, 1, 24088)) {
			t.Fatalf("follow %v: %d lines, facts %+v", follow, len(got), f)
		}
		st := src.Status()
		if st.Via != "docker json-file" || !strings.Contains(st.Resolved, fakeID+"-json.log") || st.Wrapper != "docker-json" ||
			st.Skipped["stamped before the run started"] == 0 || len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "cannot be reached") {
			t.Fatalf("status %+v", st)
		}
	}
	if _, err := os.Stat(noSocket); err == nil {
		t.Fatal("the test's socket path exists")
	}
}

// Frames of every size demux keeps whole: Docker's own (split at 16 KiB),
// one longer than its first buffer (a Docker-compatible daemon that does
// not split: it made demux slice past its buffer and crash the agent), and
// one past maxFrame, cut there, after which the next frame still reads.
func TestDemuxFramesOfEverySize(t *testing.T) {
	var stream strings.Builder
	frame := func(n int, b byte) {
		var head [8]byte
		head[0] = streamStdout
		binary.BigEndian.PutUint32(head[4:], uint32(n))
		stream.Write(head[:])
		stream.WriteString(strings.Repeat(string(b), n))
	}
	sizes := []int{16 << 10, 40000, maxFrame + 5, 7}
	for i, n := range sizes {
		frame(n, 'a'+byte(i))
	}
	var got []string
	err := demux(strings.NewReader(stream.String()), func(_ byte, p []byte) {
		got = append(got, fmt.Sprintf("%c×%d", p[0], len(p)))
	})
	want := []string{"a×16384", "b×40000", fmt.Sprintf("c×%d", maxFrame), "d×7"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("demux: %v, frames %v; want %v", err, got, want)
	}
}
