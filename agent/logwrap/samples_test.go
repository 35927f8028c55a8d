package logwrap_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
	"heft/shared/testutil"
)

// samples returns every engine log fixture with the engine that wrote it,
// each line of its launch arguments padded past Docker's 16 KiB split so
// every wrapper has to join the line that carries dp_size.
func samples(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, pattern := range []string{"testdata/engines/*.log", "testdata/logs/*.log"} {
		paths, err := filepath.Glob(filepath.Join(testutil.RepoRoot(t), pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			for i, l := range lines {
				pad := "'padding': '" + strings.Repeat("p", 20<<10) + "', "
				switch {
				case strings.Contains(l, "non-default args: {"):
					lines[i] = strings.Replace(l, "non-default args: {", "non-default args: {"+pad, 1)
				case strings.Contains(l, "server_args=ServerArgs("):
					lines[i] = strings.Replace(l, "ServerArgs(", "ServerArgs(padding='"+strings.Repeat("p", 20<<10)+"', ", 1)
				}
			}
			out[p] = lines
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d samples", len(out))
	}
	return out
}

func kindOf(path string) string {
	if strings.HasPrefix(filepath.Base(path), "sglang") {
		return "sglang"
	}
	return "vllm"
}

// Every sample, wrapped in each format a log store writes, gives exactly
// the facts of the raw log.
func TestSamplesWrappedGiveTheRawPools(t *testing.T) {
	wrappers := []struct {
		name string
		wrap func([]string) string
		want string
	}{
		{"cri", func(l []string) string { return wraptest.CRI(l, t0, 16<<10) }, logwrap.CRI},
		{"cri-split-every-40-bytes", func(l []string) string { return wraptest.CRI(l, t0, 40) }, logwrap.CRI},
		{"docker-json", func(l []string) string { return wraptest.DockerJSON(l, t0, 16<<10) }, logwrap.DockerJSON},
		{"docker-json-split-every-40-bytes", func(l []string) string { return wraptest.DockerJSON(l, t0, 40) }, logwrap.DockerJSON},
		{"journald-short", func(l []string) string { return wraptest.Journal(l, wraptest.Short, t0, "gpu-a", "python3", 4242) }, logwrap.Syslog},
		{"journald-short-precise", func(l []string) string { return wraptest.Journal(l, wraptest.ShortPrecise, t0, "gpu-a", "vllm", 1) }, logwrap.Syslog},
		{"journald-short-iso", func(l []string) string { return wraptest.Journal(l, wraptest.ShortISO, t0, "gpu-a", "sglang", 1) }, logwrap.SyslogISO},
		{"journald-short-iso-precise", func(l []string) string {
			return wraptest.Journal(l, wraptest.ShortISOPrecise, t0, "gpu-a", "sh", 1)
		}, logwrap.SyslogISO},
		{"journald-cat", func(l []string) string { return wraptest.Journal(l, wraptest.Cat, t0, "", "", 0) }, logwrap.None},
	}
	for path, lines := range samples(t) {
		g, err := engine.LogGrammar(kindOf(path))
		if err != nil {
			t.Fatal(err)
		}
		want, wantErr := enginelog.Read(g, strings.NewReader(strings.Join(lines, "\n")))
		if wantErr != nil && !strings.Contains(path, "no-pool") {
			t.Fatalf("%s: raw read: %v", path, wantErr)
		}
		for _, w := range wrappers {
			t.Run(filepath.Base(path)+"/"+w.name, func(t *testing.T) {
				tr := enginelog.NewTracker(g)
				u := logwrap.New(tr.Feed, logwrap.Options{})
				for _, l := range strings.Split(strings.TrimSuffix(w.wrap(lines), "\n"), "\n") {
					u.Line(l)
				}
				u.Flush()
				got, ok := tr.Facts()
				if ok != (wantErr == nil) {
					t.Fatalf("pools found %v, raw log: %v", ok, wantErr)
				}
				if !slices.Equal(got.Ranks, want.Ranks) || got.ExpectedRanks != want.ExpectedRanks || got.Complete != want.Complete {
					t.Fatalf("ranks %v (expected %d, complete %v), raw log %v (%d, %v)",
						got.Ranks, got.ExpectedRanks, got.Complete, want.Ranks, want.ExpectedRanks, want.Complete)
				}
				if got.Model != want.Model || got.Version != want.Version || got.Ready != want.Ready || got.Restarts != want.Restarts ||
					got.DPSize != want.DPSize || got.LaunchArgs["padding"] != want.LaunchArgs["padding"] || !slices.Equal(got.Notes, want.Notes) {
					t.Fatalf("facts differ\n got %+v\nwant %+v", got, want)
				}
				st := u.Stats()
				if st.Wrapper != w.want || st.Mixed || st.SkippedTotal() != 0 || st.Emitted != int64(len(lines)) {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	}
}
