package logwrap_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
)

var t0 = time.Date(2026, 3, 2, 10, 15, 0, 123456789, time.UTC)

// unwrap feeds text line by line and flushes at the end.
func unwrap(text string, opts logwrap.Options) ([]string, logwrap.Stats) {
	var out []string
	u := logwrap.New(func(l string) { out = append(out, l) }, opts)
	for _, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		u.Line(l)
	}
	u.Flush()
	return out, u.Stats()
}

var sample = []string{
	"[2026-03-02 10:15:01] server_args=ServerArgs(model_path='m', dp_size=2)",
	"[2026-03-02 10:15:21 DP0] max_total_num_tokens=24094, chunked_prefill_size=2048",
	"",
	"(EngineCore_DP1 pid=9) \x1b[32mINFO\x1b[0m 12-11 00:06:53 [kv_cache_utils.py:1286] GPU KV cache size: 2,925 tokens",
	"Capturing batches (bs=1 avail_mem=2.61 GB): 100%|██████████| 7/7 [00:02<00:00,  2.93it/s]",
	`{"not": "a docker entry"}`,
}

func TestRoundTrips(t *testing.T) {
	tests := []struct {
		name, text, wrapper string
	}{
		{"cri", wraptest.CRI(sample, t0, 0), logwrap.CRI},
		{"cri split in 5-byte chunks", wraptest.CRI(sample, t0, 5), logwrap.CRI},
		{"docker", wraptest.DockerJSON(sample, t0, 16<<10), logwrap.DockerJSON},
		{"docker split in 3-byte entries", wraptest.DockerJSON(sample, t0, 3), logwrap.DockerJSON},
		{"journal short", wraptest.Journal(sample, wraptest.Short, t0, "gpu-a", "python3", 88), logwrap.Syslog},
		{"journal short-precise", wraptest.Journal(sample, wraptest.ShortPrecise, t0, "gpu-a", "python3", 88), logwrap.Syslog},
		{"journal short-iso", wraptest.Journal(sample, wraptest.ShortISO, t0, "gpu-a", "python3", 88), logwrap.SyslogISO},
		{"journal short-iso-precise", wraptest.Journal(sample, wraptest.ShortISOPrecise, t0, "gpu-a", "python3", 88), logwrap.SyslogISO},
		{"journal cat", wraptest.Journal(sample, wraptest.Cat, t0, "gpu-a", "python3", 88), logwrap.None},
		{"no hostname", "Mar  2 10:15:21 vllm[4]: " + strings.Join(sample, "\nMar  2 10:15:21 vllm[4]: "), logwrap.Syslog},
		{"ident without pid", "Mar  2 10:15:21 host vllm: " + strings.Join(sample, "\nMar  2 10:15:21 host vllm: "), logwrap.Syslog},
		{"rsyslog RFC 3339", "2026-03-02T10:15:21.123456+01:00 host vllm[7]: " + strings.Join(sample, "\n2026-03-02T10:15:21.123456+01:00 host vllm[7]: "), logwrap.SyslogISO},
		{"short-monotonic", "[   12.345678] host vllm[7]: " + strings.Join(sample, "\n[   12.345678] host vllm[7]: "), logwrap.SyslogMono},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, st := unwrap(tc.text, logwrap.Options{})
			if !slices.Equal(got, sample) {
				t.Fatalf("lines\n got %q\nwant %q", got, sample)
			}
			if st.Wrapper != tc.wrapper || st.Mixed || st.SkippedTotal() != 0 || st.Emitted != int64(len(sample)) ||
				st.Lines != int64(strings.Count(strings.TrimSuffix(tc.text, "\n"), "\n")+1) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Chunks of the two streams interleave as the runtime writes them; each
// stream's line is joined on its own.
func TestCRIInterleavedStreams(t *testing.T) {
	text := "2026-03-02T10:15:21.000000001Z stderr P [2026-03-02 10:15:21 DP1] max_total_\n" +
		"2026-03-02T10:15:21.000000002Z stdout P progress 1\n" +
		"2026-03-02T10:15:21.000000003Z stderr P num_tokens=2925, chunk\n" +
		"2026-03-02T10:15:21.000000004Z stdout F 0%\n" +
		"2026-03-02T10:15:21.000000005Z stderr F ed_prefill_size=2048\n" +
		"2026-03-02T10:15:21.000000006Z stdout F\n"
	got, st := unwrap(text, logwrap.Options{})
	want := []string{"progress 10%", "[2026-03-02 10:15:21 DP1] max_total_num_tokens=2925, chunked_prefill_size=2048", ""}
	if !slices.Equal(got, want) || st.Emitted != 3 || st.Lines != 6 {
		t.Fatalf("got %q stats %+v", got, st)
	}
}

func TestBadInput(t *testing.T) {
	good := func(dp, n int) string {
		return fmt.Sprintf("[2026-03-02 10:15:21 DP%d] max_total_num_tokens=%d, chunked_prefill_size=2048", dp, n)
	}
	tests := []struct {
		name   string
		text   string
		want   []string
		reason string
	}{
		{"truncated json objects", `{"log":"` + good(0, 1) + `\n","stream":"stderr","time":"2026-03-02T10:15:21Z"}` + "\n" +
			`{"log":"[2026-03-02 10:15:21 DP1] max_total_num_tok` + "\n" +
			`{"log":"` + good(1, 2) + `\n","stream":"stderr","time":"2026-03-02T10:15:22Z"}` + "\n" +
			`{"log":"x\n","stream":"stderr","ti` + "\n",
			[]string{good(0, 1), good(1, 2)}, logwrap.SkipBadJSON},
		{"json without a log field in a docker file", `{"log":"a\n","stream":"stdout"}` + "\n" + `{"stream":"stdout"}` + "\n" + `{"log":"b\n"}`,
			[]string{"a", "b"}, logwrap.SkipNoLogField},
		{"cri line without a tag", "2026-03-02T10:15:21Z stdout F " + good(0, 1) + "\n" +
			"2026-03-02T10:15:21Z stdout " + good(1, 9) + "\n" +
			"2026-03-02T10:15:21Z stdout F " + good(1, 2),
			[]string{good(0, 1), good(1, 2)}, logwrap.SkipCRINoTag},
		{"binary garbage between lines", "2026-03-02T10:15:21Z stdout F " + good(0, 1) + "\n" +
			"\x00\x01\x02\xff\xfe garbage \x00\n" +
			"\x89PNG\r\x1a\x0b\x0c\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\n" +
			"2026-03-02T10:15:21Z stdout F " + good(1, 2),
			[]string{good(0, 1), good(1, 2)}, logwrap.SkipBinary},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, st := unwrap(tc.text, logwrap.Options{})
			if !slices.Equal(got, tc.want) {
				t.Fatalf("lines\n got %q\nwant %q", got, tc.want)
			}
			if st.Skipped[tc.reason] == 0 || !strings.Contains(st.LastProblem, tc.reason) {
				t.Fatalf("stats %+v, want a skip for %q", st, tc.reason)
			}
		})
	}
}

// A "P" chunk that never ends is cut at the line limit; the rest of it is
// dropped up to its "F", and lines after it are read as before.
func TestNeverEndingPartial(t *testing.T) {
	var b strings.Builder
	chunk := strings.Repeat("x", 16<<10)
	for range 10 {
		b.WriteString("2026-03-02T10:15:21Z stdout P " + chunk + "\n")
	}
	b.WriteString("2026-03-02T10:15:21Z stderr F after\n")
	b.WriteString("2026-03-02T10:15:21Z stdout F end\n")
	b.WriteString("2026-03-02T10:15:21Z stdout F next\n")
	got, st := unwrap(b.String(), logwrap.Options{})
	if len(got) != 3 || len(got[0]) != logwrap.DefaultMaxLineBytes || got[1] != "after" || got[2] != "next" {
		t.Fatalf("got %d lines: %d bytes, %q", len(got), len(got[0]), got[1:])
	}
	if st.Skipped[logwrap.SkipOverlong] != 7 {
		t.Fatalf("stats %+v", st)
	}

	// At the end of the input the pending chunks go out as they are.
	got, _ = unwrap("2026-03-02T10:15:21Z stdout P begun\n2026-03-02T10:15:21Z stdout P  but\n", logwrap.Options{})
	if !slices.Equal(got, []string{"begun but"}) {
		t.Fatalf("flushed %q", got)
	}
	// A Docker line split past the limit, with a smaller limit.
	got, st = unwrap(wraptest.DockerJSON([]string{strings.Repeat("y", 100), "z"}, t0, 10), logwrap.Options{MaxLineBytes: 25})
	if !slices.Equal(got, []string{strings.Repeat("y", 25), "z"}) || st.Skipped[logwrap.SkipOverlong] != 8 {
		t.Fatalf("got %q stats %+v", got, st)
	}
}

// Formats mixed in one file: each line is unwrapped by its own wrapper.
func TestMixedFormats(t *testing.T) {
	text := wraptest.CRI(sample[:2], t0, 0) +
		sample[3] + "\n" +
		wraptest.Journal(sample[1:2], wraptest.ShortISO, t0, "h", "sglang", 3) +
		wraptest.DockerJSON(sample[3:4], t0, 0) +
		`{"a": 1}` + "\n"
	got, st := unwrap(text, logwrap.Options{})
	want := []string{sample[0], sample[1], sample[3], sample[1], sample[3], `{"a": 1}`}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
	if st.Wrapper != logwrap.CRI || !st.Mixed || st.ByWrapper[logwrap.CRI] != 2 || st.ByWrapper[logwrap.None] != 2 ||
		st.ByWrapper[logwrap.SyslogISO] != 1 || st.ByWrapper[logwrap.DockerJSON] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// In a Docker file a cut entry is skipped; in a raw log a line that only
// looks like JSON is the engine's.
func TestExpectationDecidesBrokenJSON(t *testing.T) {
	broken := `{"lo` + "\n"
	got, st := unwrap(wraptest.DockerJSON([]string{"a", "b"}, t0, 0)+broken, logwrap.Options{})
	if !slices.Equal(got, []string{"a", "b"}) || st.Skipped[logwrap.SkipBadJSON] != 1 {
		t.Fatalf("docker file: %q %+v", got, st)
	}
	got, st = unwrap("raw 1\nraw 2\n"+broken, logwrap.Options{})
	if !slices.Equal(got, []string{"raw 1", "raw 2", `{"lo`}) || st.SkippedTotal() != 0 {
		t.Fatalf("raw file: %q %+v", got, st)
	}
}

func TestSinceDropsEarlierRuns(t *testing.T) {
	old := wraptest.CRI([]string{"old 1", "old 2"}, t0, 0) + wraptest.DockerJSON([]string{"old 3"}, t0, 0)
	cur := wraptest.CRI([]string{"new 1"}, t0.Add(time.Hour), 0) + wraptest.DockerJSON([]string{"new 2"}, t0.Add(time.Hour), 0)
	got, st := unwrap(old+cur+"raw\n", logwrap.Options{Since: t0.Add(time.Minute)})
	if !slices.Equal(got, []string{"new 1", "new 2", "raw"}) || st.Skipped[logwrap.SkipBeforeRun] != 3 {
		t.Fatalf("got %q %+v", got, st)
	}
}

func TestDockerTTY(t *testing.T) {
	got, _ := unwrap(`{"log":"INFO: line\r\n","stream":"stdout","time":"2026-03-02T10:15:21Z"}`, logwrap.Options{})
	if !slices.Equal(got, []string{"INFO: line"}) {
		t.Fatalf("got %q", got)
	}
}

// Stats may be read while another goroutine unwraps; run with -race.
func TestStatsConcurrent(t *testing.T) {
	u := logwrap.New(func(string) {}, logwrap.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			u.Line("2026-03-02T10:15:21Z stdout F x")
			u.Line("\x00")
		}
	}()
	for range 100 {
		_ = u.Stats()
	}
	<-done
	if st := u.Stats(); st.Lines != 4000 || st.Emitted != 2000 || st.Skipped[logwrap.SkipBinary] != 2000 {
		t.Fatalf("%+v", st)
	}
}

// kubectl logs --timestamps / docker logs -t put only a UTC time before
// each line; the engine's own "INFO:" must not be taken for a syslog
// identifier, and journald's short-iso (with ident[pid]) stays syslog.
func TestTimestampsWrapper(t *testing.T) {
	var got []string
	u := logwrap.New(func(s string) { got = append(got, s) }, logwrap.Options{})
	u.Line("2026-03-02T10:15:21.123456789Z (APIServer pid=1) INFO:     Application startup complete.")
	u.Line("2026-03-02T10:15:21.2Z INFO:     Application startup complete.")
	u.Line("2026-03-02T10:15:21.123456+00:00 gpu-a python3[42]: INFO:     Uvicorn running")
	u.Line("2026-03-02T10:15:22Z gpu-a python3[42]: stamped Z but journald-shaped")
	want := []string{"(APIServer pid=1) INFO:     Application startup complete.", "INFO:     Application startup complete.",
		"INFO:     Uvicorn running", "stamped Z but journald-shaped"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
	if s := u.Stats(); s.ByWrapper[logwrap.Timestamps] != 2 || s.ByWrapper[logwrap.SyslogISO] != 2 {
		t.Fatalf("stats %+v", s)
	}
}
