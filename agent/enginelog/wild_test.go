package enginelog_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"heft/agent/enginelog"
	"heft/agent/logwrap"
	"heft/agent/logwrap/wraptest"
)

// wildTruth is what a careful reader takes from one start-up log pasted in
// a public engine issue (testdata/engines/wild/truth.json).
type wildTruth struct {
	File          string           `json:"file"`
	Engine        string           `json:"engine"`
	Source        string           `json:"source"`
	Ranks         map[string]int64 `json:"ranks"`
	Error         string           `json:"error"` // "", "no_pools", "several_servers"
	ExpectedRanks int              `json:"expected_ranks"`
	Complete      *bool            `json:"complete"` // null: the log cannot show it
	Ready         bool             `json:"ready"`
	VersionRead   string           `json:"version_read"`
	DPSize        int              `json:"dp_size"`
}

const wildDir = "../../testdata/engines/wild"

// TestWildLogs reads every real log in testdata/engines/wild, raw and in
// each wrapper a log store puts around it, and checks the recorded truth.
func TestWildLogs(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(wildDir, "truth.json"))
	if err != nil {
		t.Fatal(err)
	}
	var truths []wildTruth
	if err := json.Unmarshal(raw, &truths); err != nil {
		t.Fatal(err)
	}
	if len(truths) < 20 {
		t.Errorf("%d wild logs; the set should keep at least 20", len(truths))
	}
	t0 := time.Date(2026, 3, 2, 10, 15, 21, 0, time.UTC)
	wrappers := []struct {
		name string
		wrap func([]string) string
	}{
		{"raw", func(l []string) string { return strings.Join(l, "\n") + "\n" }},
		{"cri", func(l []string) string { return wraptest.CRI(l, t0, 16<<10) }},
		{"cri-split-512", func(l []string) string { return wraptest.CRI(l, t0, 512) }},
		{"docker-json", func(l []string) string { return wraptest.DockerJSON(l, t0, 16<<10) }},
		{"journald-short", func(l []string) string { return wraptest.Journal(l, wraptest.Short, t0, "gpu-a", "python3", 4242) }},
		{"journald-short-iso", func(l []string) string {
			return wraptest.Journal(l, wraptest.ShortISOPrecise, t0, "gpu-a", "python3", 4242)
		}},
		{"kubectl-timestamps", func(l []string) string { return wraptest.Timestamps(l, t0) }},
	}
	for _, tr := range truths {
		text, err := os.ReadFile(filepath.Join(wildDir, tr.File))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(text), "\n"), "\n")
		for _, w := range wrappers {
			t.Run(tr.File+"/"+w.name, func(t *testing.T) {
				f, err := readWrapped(gram(t, tr.Engine), w.wrap(lines))
				checkWild(t, tr, f, err)
			})
		}
		t.Run(tr.File+"/direct", func(t *testing.T) {
			f, err := enginelog.Read(gram(t, tr.Engine), strings.NewReader(string(text)))
			checkWild(t, tr, f, err)
		})
	}
}

// readWrapped takes the wrapper off as the agent does, then reads the log.
func readWrapped(g *enginelog.Grammar, wrapped string) (enginelog.Facts, error) {
	return enginelog.ReadEach(g, func(yield func(string)) error {
		u := logwrap.New(yield, logwrap.Options{})
		sc := bufio.NewScanner(strings.NewReader(wrapped))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			u.Line(sc.Text())
		}
		u.Flush()
		return sc.Err()
	})
}

func checkWild(t *testing.T, tr wildTruth, f enginelog.Facts, err error) {
	t.Helper()
	switch tr.Error {
	case "":
		if err != nil {
			t.Fatalf("%s: %v", tr.Source, err)
		}
	case "no_pools":
		if !errors.Is(err, enginelog.ErrNoPools) {
			t.Fatalf("%s: err %v, want no pools", tr.Source, err)
		}
	case "several_servers":
		if !errors.Is(err, enginelog.ErrSeveralServers) {
			t.Fatalf("%s: err %v, want several servers", tr.Source, err)
		}
	}
	got := map[string]int64{}
	for _, r := range f.Ranks {
		got[strconv.Itoa(r.DPRank)] = r.KVTokens
	}
	if !maps.Equal(got, tr.Ranks) {
		t.Errorf("ranks %v, want %v (notes %q)", got, tr.Ranks, f.Notes)
	}
	if f.ExpectedRanks != tr.ExpectedRanks {
		t.Errorf("expected ranks %d, want %d (from %q)", f.ExpectedRanks, tr.ExpectedRanks, f.ExpectedFrom)
	}
	unknown := f.RankCountUnknown != ""
	switch {
	case tr.Complete == nil && !unknown:
		t.Errorf("complete %v, want unknown (notes %q)", f.Complete, f.Notes)
	case tr.Complete != nil && (unknown || f.Complete != *tr.Complete):
		t.Errorf("complete %v (unknown: %q), want %v", f.Complete, f.RankCountUnknown, *tr.Complete)
	}
	if tr.Complete == nil && f.Complete {
		t.Errorf("complete claimed where the log cannot show it")
	}
	if f.Ready != tr.Ready {
		t.Errorf("ready %v, want %v", f.Ready, tr.Ready)
	}
	if tr.VersionRead != "" && f.Version != tr.VersionRead {
		t.Errorf("version %q, want %q", f.Version, tr.VersionRead)
	}
	if tr.DPSize != 0 && f.DPSize != tr.DPSize {
		t.Errorf("dp size %d, want %d", f.DPSize, tr.DPSize)
	}
	if len(f.Notes) > 0 && slices.Contains(f.Notes, "") {
		t.Errorf("an empty note: %q", f.Notes)
	}
}
