package store

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/testutil"
	"heft/shared/wire"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

func open(t *testing.T, dir string) *Bolt {
	t.Helper()
	b, err := Open(dir, testLogger(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

func measurement(key string, tps float64, at time.Time) wire.Measurement {
	return wire.Measurement{
		CapacityKey: key, Node: "gpu-a", EngineKind: "vllm", EngineURL: "http://127.0.0.1:8000", Model: "m",
		ThroughputTPS: tps, WarmupTPS: tps * 0.9, OutputTokens: 2048, ExpectedTokens: 2048, WallSeconds: 2048 / tps,
		Requests: 16, Concurrency: 16, TokensPerReq: 128, Complete: true, Trigger: wire.ReasonRegistration,
		StartedAt: at.Add(-time.Second).UTC(), FinishedAt: at.UTC(),
	}
}

func hashFile(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	defer b.Close()

	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := fleet.WorkerRecord{ID: "k1", Node: "gpu-a", Model: "m", Engine: "sglang", URL: "http://127.0.0.1:30000",
		EngineVersion: "0.4.1", LaunchArgs: []string{"--dp-size=2"}, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}},
		MaxModelLen: 40960, FirstSeen: at, LastSeen: at.Add(time.Hour),
		Pace: &fleet.PaceRecord{Measured: at, Points: [][2]float64{{8, 0.0072}, {16, 0.008}}, Learned: 1, Last: at.Add(time.Minute), Slow: 2, Factor: 2.1}}
	m1 := measurement("k1", 992, at)
	m1.Prefill = &wire.Prefill{ThroughputTPS: 17580, PromptTokens: 32768, WallSeconds: 1.86, PromptLength: 8192, Requests: 4, Concurrency: 4, Complete: true}
	m2 := measurement("k2", 453, at)
	for _, err := range []error{
		b.SavePin("k1", 1.5), b.SavePin("k2", 0.5), b.DeletePin("k2"), b.DeletePin("never-pinned"),
		b.SavePrefillPin("k2", 2.5), b.SavePrefillPin("k1", 0.75), b.DeletePrefillPin("k1"), b.DeletePrefillPin("never-pinned"),
		b.SaveDecision("k1", fleet.DecisionAdmit), b.SaveDecision("k2", fleet.DecisionHold), b.DeleteDecision("k1"),
		b.SaveMeasurement(m1, 10), b.SaveMeasurement(m2, 10), b.SaveWorker(rec),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pins) != 1 || st.Pins["k1"] != 1.5 {
		t.Errorf("pins = %v, want k1=1.5 only", st.Pins)
	}
	if len(st.PrefillPins) != 1 || st.PrefillPins["k2"] != 2.5 {
		t.Errorf("prefill pins = %v, want k2=2.5 only", st.PrefillPins)
	}
	if p := st.Latest["k1"].Prefill; p == nil || p.ThroughputTPS != 17580 {
		t.Errorf("latest k1 prefill = %+v", p)
	}
	if len(st.Decisions) != 1 || st.Decisions["k2"] != fleet.DecisionHold {
		t.Errorf("decisions = %v, want k2=hold only", st.Decisions)
	}
	if got := st.Latest["k1"]; got.ThroughputTPS != 992 || !got.FinishedAt.Equal(m1.FinishedAt) || got.Model != "m" {
		t.Errorf("latest k1 = %+v", got)
	}
	if len(st.History["k2"]) != 1 || st.History["k2"][0].ThroughputTPS != 453 {
		t.Errorf("history k2 = %+v", st.History["k2"])
	}
	got := st.Workers["k1"]
	if got.URL != rec.URL || len(got.Ranks) != 2 || got.Ranks[1].KVTokens != 2925 || !got.LastSeen.Equal(rec.LastSeen) || got.LaunchArgs[0] != "--dp-size=2" ||
		got.MaxModelLen != 40960 {
		t.Errorf("worker = %+v", got)
	}
	if p := got.Pace; p == nil || !p.Measured.Equal(at) || !slices.Equal(p.Points, rec.Pace.Points) || p.Factor != 2.1 || p.Slow != 2 || !p.Last.Equal(rec.Pace.Last) {
		t.Errorf("worker pace = %+v, want %+v", p, rec.Pace)
	}
	if fi, err := os.Stat(filepath.Join(dir, FileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}

func TestHistoryBound(t *testing.T) {
	b := open(t, t.TempDir())
	defer b.Close()
	at := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := range 7 {
		if err := b.SaveMeasurement(measurement("k", float64(100+i), at.Add(time.Duration(i)*time.Hour)), 3); err != nil {
			t.Fatal(err)
		}
	}
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	var tps []float64
	for _, m := range st.History["k"] {
		tps = append(tps, m.ThroughputTPS)
	}
	if fmt.Sprint(tps) != "[104 105 106]" {
		t.Errorf("history = %v, want the newest three oldest first [104 105 106]", tps)
	}
	if st.Latest["k"].ThroughputTPS != 106 {
		t.Errorf("latest = %v, want 106", st.Latest["k"].ThroughputTPS)
	}
}

func TestReopenAfterClose(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if err := b.SavePin("k", 2); err != nil {
		t.Fatal(err)
	}
	if err := b.SaveMeasurement(measurement("k", 700, time.Now()), 5); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = open(t, dir)
	defer b.Close()
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if st.Pins["k"] != 2 || st.Latest["k"].ThroughputTPS != 700 || len(st.History["k"]) != 1 {
		t.Errorf("after reopen: pins %v latest %v history %d", st.Pins, st.Latest["k"].ThroughputTPS, len(st.History["k"]))
	}
}

func TestInvalidWritesRejected(t *testing.T) {
	b := open(t, t.TempDir())
	defer b.Close()
	bad := measurement("k", math.NaN(), time.Now())
	neg := measurement("k", -5, time.Now())
	inf := measurement("k", math.Inf(1), time.Now())
	cases := map[string]error{
		"NaN pin":            b.SavePin("k", math.NaN()),
		"zero prefill pin":   b.SavePrefillPin("k", 0),
		"negative pin":       b.SavePin("k", -1),
		"zero pin":           b.SavePin("k", 0),
		"infinite pin":       b.SavePin("k", math.Inf(1)),
		"empty id":           b.SavePin("", 1),
		"unknown decision":   b.SaveDecision("k", "maybe"),
		"NaN throughput":     b.SaveMeasurement(bad, 5),
		"negative tps":       b.SaveMeasurement(neg, 5),
		"infinite tps":       b.SaveMeasurement(inf, 5),
		"zero history":       b.SaveMeasurement(measurement("k", 5, time.Now()), 0),
		"negative rank pool": b.SaveWorker(fleet.WorkerRecord{ID: "k", Ranks: []wire.Rank{{DPRank: 0, KVTokens: -1}}}),
		"worker without id":  b.SaveWorker(fleet.WorkerRecord{}),
	}
	for name, err := range cases {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pins)+len(st.Decisions)+len(st.Latest)+len(st.History)+len(st.Workers) != 0 {
		t.Errorf("rejected writes left state behind: %+v", st)
	}
}

func TestLoadSkipsBadRecords(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if err := b.SavePin("good", 1.25); err != nil {
		t.Fatal(err)
	}
	if err := b.SaveMeasurement(measurement("good", 500, time.Now()), 5); err != nil {
		t.Fatal(err)
	}
	b.Close()

	// Write records a buggy writer might have left (with checksums that
	// hold), and one whose checksum does not.
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, kv := range []struct{ bucket, key, val []byte }{
			{bucketPins, []byte("nan"), []byte(`"NaN"`)},
			{bucketPins, []byte("neg"), []byte(`-2`)},
			{bucketPins, []byte("text"), []byte(`{not json`)},
			{bucketDecisions, []byte("odd"), []byte(`"perhaps"`)},
			{bucketLatest, []byte("bad"), []byte(`{"capacity_key":"bad","throughput_tps":-3}`)},
			{bucketLatest, []byte("moved"), []byte(`{"capacity_key":"elsewhere","throughput_tps":3}`)},
			{bucketWorkers, []byte("w"), []byte(`[1,2]`)},
		} {
			if err := tx.Bucket(kv.bucket).Put(kv.key, seal(kv.bucket, kv.key, kv.val)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketPins).Put([]byte("unsealed"), []byte("2.5"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	var logs testutil.SyncBuffer
	b, err = Open(dir, hclog.New(&hclog.LoggerOptions{Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pins) != 1 || st.Pins["good"] != 1.25 {
		t.Errorf("pins = %v, want only good=1.25", st.Pins)
	}
	// A bad decision fails closed: its worker is held (TestDamagedRecordsFailClosed).
	if len(st.Decisions) != 1 || st.Decisions["odd"] != fleet.DecisionHold || len(st.Workers) != 0 {
		t.Errorf("bad decisions/workers: %v %v, want only odd held", st.Decisions, st.Workers)
	}
	if len(st.Latest) != 1 || st.Latest["good"].ThroughputTPS != 500 {
		t.Errorf("latest = %v, want only good", st.Latest)
	}
	if n := strings.Count(logs.String(), "dropping an unreadable"); n != 8 {
		t.Errorf("logged %d warnings, want 8:\n%s", n, logs.String())
	}
}

func TestNewerSchemaRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if err := b.SavePin("k", 3); err != nil {
		t.Fatal(err)
	}
	b.Close()
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, []byte("3")) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	before := hashFile(t, path)
	_, err = Open(dir, testLogger(t))
	if err == nil {
		t.Fatal("Open accepted a newer schema")
	}
	if !errors.Is(err, ErrRefused) {
		t.Errorf("error %v does not wrap ErrRefused", err)
	}
	for _, want := range []string{path, "schema version 3", "up to version 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if hashFile(t, path) != before {
		t.Error("the refused state file was modified")
	}
}

func TestCorruptFilesRefusedUntouched(t *testing.T) {
	// A real state file, big enough to span many pages.
	src := t.TempDir()
	b := open(t, src)
	for i := range 120 {
		m := measurement(fmt.Sprintf("key-%03d", i), float64(100+i), time.Now())
		m.Prompt = strings.Repeat("p", 400)
		if err := b.SaveMeasurement(m, 50); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	good, err := os.ReadFile(filepath.Join(src, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if len(good) < 64<<10 {
		t.Fatalf("fixture only %d bytes", len(good))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	scrambled := bytes.Clone(good)
	for i := 2 * 4096; i < len(scrambled); i++ {
		scrambled[i] = byte(rng.Uint32())
	}
	cases := map[string][]byte{
		"garbage":             garbage,
		"short text":          []byte("this is not a database\n"),
		"truncated to half":   good[:len(good)/2],
		"truncated to 3 page": good[:3*4096],
		"truncated mid meta":  good[:5000],
		"data pages garbled":  scrambled,
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			b, err := Open(dir, testLogger(t))
			if err == nil {
				b.Close()
				t.Fatal("Open accepted a corrupt file")
			}
			for _, want := range []string{path, "corrupt", "move it aside"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			after, rerr := os.ReadFile(path)
			if rerr != nil || !bytes.Equal(after, content) {
				t.Error("the refused state file was modified")
			}
		})
	}
}

// Garbling any single page must give either a clean refusal or a file that
// loads; never a crash.
func TestEveryPageGarbled(t *testing.T) {
	src := t.TempDir()
	b := open(t, src)
	for i := range 30 {
		m := measurement(fmt.Sprintf("key-%03d", i), float64(100+i), time.Now())
		m.Prompt = strings.Repeat("p", 300)
		if err := b.SaveMeasurement(m, 50); err != nil {
			t.Fatal(err)
		}
		if err := b.SavePin(fmt.Sprintf("key-%03d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	good, err := os.ReadFile(filepath.Join(src, FileName))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	refused := 0
	for page := 2; page*4096 < len(good); page++ {
		content := bytes.Clone(good)
		for i := page * 4096; i < (page+1)*4096; i++ {
			content[i] = byte(rng.Uint32())
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, FileName), content, 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := Open(dir, hclog.NewNullLogger())
		if err != nil {
			if !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("page %d: error %q does not say corrupt", page, err)
			}
			refused++
			continue
		}
		if _, err := b.Load(); err != nil {
			t.Errorf("page %d: opened, but Load failed: %v", page, err)
		}
		b.Close()
	}
	if refused == 0 {
		t.Error("no garbled page was noticed")
	}
	t.Logf("%d of %d garbled pages refused", refused, len(good)/4096-2)
}

func TestForeignBoltFileRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before := hashFile(t, path)
	if _, err := Open(dir, testLogger(t)); err == nil || !strings.Contains(err.Error(), "not a heft state file") {
		t.Fatalf("err = %v, want a not-a-heft-state-file error", err)
	}
	if hashFile(t, path) != before {
		t.Error("the refused file was modified")
	}
}

// A 0-byte state file, or a bbolt file without a bucket, would start
// blank and drop every pin without a word: refused, untouched, unless
// Init (heft-coordinator --init). An absent file is a first start.
func TestEmptyFileRefusedUnlessInit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, path string)
	}{
		{"zero bytes", func(t *testing.T, path string) {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"no buckets", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			db.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			tc.write(t, path)
			before := hashFile(t, path)
			_, err := Open(dir, testLogger(t))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "--init") {
				t.Fatalf("Open: %v, want a refusal naming --init", err)
			}
			if hashFile(t, path) != before {
				t.Error("the refused file was written to")
			}
			b, err := Open(dir, testLogger(t), Init())
			if err != nil {
				t.Fatalf("Open with Init: %v", err)
			}
			if err := b.SavePin("k", 1); err != nil {
				t.Fatal(err)
			}
			b.Close()
			b = open(t, dir) // a state file now: no Init needed
			defer b.Close()
			if st, err := b.Load(); err != nil || st.Pins["k"] != 1 {
				t.Errorf("pins %v (%v)", st.Pins, err)
			}
		})
	}
	// An absent file is a first start.
	b := open(t, filepath.Join(t.TempDir(), "new"))
	b.Close()
}

// A heft state file that lost a bucket is refused unless Init, which
// recreates it empty and keeps the other records.
func TestMissingBucketRefusedUnlessInit(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if err := b.SavePin("k", 2); err != nil {
		t.Fatal(err)
	}
	if err := b.SaveDecision("k", fleet.DecisionHold); err != nil {
		t.Fatal(err)
	}
	b.Close()
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketPins) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before := hashFile(t, path)
	if _, err := Open(dir, testLogger(t)); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "pins") {
		t.Fatalf("Open: %v, want a refusal naming the pins bucket", err)
	}
	if hashFile(t, path) != before {
		t.Error("the refused file was written to")
	}
	b, err = Open(dir, testLogger(t), Init())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := b.Load()
	if err != nil || len(st.Pins) != 0 || st.Decisions["k"] != fleet.DecisionHold {
		t.Errorf("after Init: pins %v decisions %v (%v)", st.Pins, st.Decisions, err)
	}
}

// Issue 16, case 6 (store): a changed byte inside any stored record is
// caught by its checksum and the record dropped with a warning, never
// served: a pin of 5.131 does not come back as 7.131, a throughput does
// not change, a record moved under another key is not taken.
func TestChangedBytesAreNotServed(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, err := range []error{
		b.SavePin("k", 5.131), b.SavePin("other", 1.5), b.SaveDecision("k", fleet.DecisionAdmit),
		b.SaveMeasurement(measurement("k", 1234.5, at), 5),
		b.SaveWorker(fleet.WorkerRecord{ID: "k", Node: "gpu-a", Model: "m", URL: "http://10.0.0.1:8000", FirstSeen: at, LastSeen: at}),
		b.SaveNode(nodes.Record{Name: "gpu-a", State: nodes.StateEnrolled, CredentialSHA256: strings.Repeat("ab", 32), Since: at, LastSeen: at}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	changeBytes(t, dir, map[string]string{"5.131": "7.131", "1234.5": "9234.5", "10.0.0.1": "10.6.6.6", strings.Repeat("ab", 32): strings.Repeat("cd", 32)})
	var logs testutil.SyncBuffer
	b, err := Open(dir, hclog.New(&hclog.LoggerOptions{Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := b.LoadNodes()
	if err != nil {
		t.Fatal(err)
	}
	_, pin := st.Pins["k"]
	_, meas := st.Latest["k"]
	_, hist := st.History["k"]
	_, rec := st.Workers["k"]
	node := ns["gpu-a"].State != nodes.StateDamaged || ns["gpu-a"].CredentialSHA256 != "" // a damaged name is kept bound, nothing of it served
	t.Logf("after changing a digit: pin served=%v, measurement served=%v, history served=%v, worker served=%v, node served=%v; other pin %v, decision %q",
		pin, meas, hist, rec, node, st.Pins["other"], st.Decisions["k"])
	if pin || meas || hist || rec || node {
		t.Error("a changed record was served")
	}
	if st.Pins["other"] != 1.5 || st.Decisions["k"] != fleet.DecisionAdmit {
		t.Error("an unchanged record was dropped")
	}
	if n := strings.Count(logs.String(), "failed its checksum"); n != 5 {
		t.Errorf("%d checksum warnings, want 5:\n%s", n, logs.String())
	}
}

// A state file written by the code before checksums (schema 1, made with
// commit 3b3eea0; see testdata/README.md) loads whole, is copied aside,
// upgraded to schema 2 in place and then checksummed like any other; its
// node names are kept as unbound nodes.
func TestSchema1Upgrade(t *testing.T) {
	dir := t.TempDir()
	fixture, err := os.ReadFile(filepath.Join("testdata", "schema1.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	b := open(t, dir)
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := b.LoadNodes()
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if st.Pins["gpu-a-key-0"] != 5.131 || st.Decisions["gpu-b-key-1"] != fleet.DecisionHold || len(st.Latest) != 2 ||
		len(st.History["gpu-a-key-0"]) != 3 || len(st.Workers) != 2 || st.Latest["gpu-b-key-1"].ThroughputTPS != 1102 {
		t.Errorf("loaded pins %v decisions %v latest %d history %d workers %d", st.Pins, st.Decisions, len(st.Latest),
			len(st.History["gpu-a-key-0"]), len(st.Workers))
	}
	if len(ns) != 2 || ns["gpu-a"].State != nodes.StateUnbound || ns["gpu-a"].CredentialSHA256 != "" {
		t.Errorf("nodes %+v, want gpu-a and gpu-b unbound", ns)
	}
	if copied, err := os.ReadFile(path + ".schema1"); err != nil || !bytes.Equal(copied, fixture) {
		t.Errorf("the schema-1 file was not copied aside as it was (%v)", err)
	}
	// Upgraded: schema 2 on disk, and a changed digit is now caught.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var schema string
	_ = db.View(func(tx *bolt.Tx) error { schema = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil })
	db.Close()
	if schema != "2" {
		t.Errorf("schema %q after the upgrade", schema)
	}
	data, _ := os.ReadFile(path)
	if err := os.WriteFile(path, bytes.ReplaceAll(data, []byte("5.131"), []byte("7.131")), 0o600); err != nil {
		t.Fatal(err)
	}
	b = open(t, dir)
	defer b.Close()
	if st, _ := b.Load(); st.Pins["gpu-a-key-0"] == 7.131 {
		t.Error("a changed digit loaded after the upgrade")
	}
}

func TestSecondOpenWhileLocked(t *testing.T) {
	old := lockTimeout
	lockTimeout = 100 * time.Millisecond
	defer func() { lockTimeout = old }()

	dir := t.TempDir()
	first := open(t, dir)
	_, err := Open(dir, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open: err = %v, want a lock error", err)
	}
	// The first holder is unaffected, and the file opens once it lets go.
	if err := first.SavePin("k", 1); err != nil {
		t.Fatal(err)
	}
	first.Close()
	second := open(t, dir)
	defer second.Close()
	st, err := second.Load()
	if err != nil || st.Pins["k"] != 1 {
		t.Fatalf("after the first closed: %v %v", st.Pins, err)
	}
}

func TestStateDirIsAFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(file, testLogger(t)); err == nil {
		t.Fatal("Open used a file as state_dir")
	}
	if _, err := Open("", testLogger(t)); err == nil {
		t.Fatal("Open accepted an empty state_dir")
	}
}

// A write acknowledged before the process is killed is there afterwards,
// and the dead process's lock does not block the next start.
func TestWriteSurvivesKill(t *testing.T) {
	if dir := os.Getenv("HEFT_STORE_CHILD_DIR"); dir != "" {
		b, err := Open(dir, hclog.NewNullLogger())
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(1)
		}
		if err := b.SavePin("k", 2.5); err != nil {
			fmt.Println("save:", err)
			os.Exit(1)
		}
		if err := b.SaveMeasurement(measurement("k", 812, time.Now()), 5); err != nil {
			fmt.Println("save:", err)
			os.Exit(1)
		}
		fmt.Println("written")
		select {} // wait to be killed, holding the lock
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWriteSurvivesKill$")
	cmd.Env = append(os.Environ(), "HEFT_STORE_CHILD_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "written\n" {
		_ = cmd.Process.Kill()
		t.Fatalf("child said %q, %v", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	b := open(t, dir)
	defer b.Close()
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if st.Pins["k"] != 2.5 || st.Latest["k"].ThroughputTPS != 812 {
		t.Errorf("after SIGKILL: pins %v latest %v", st.Pins, st.Latest["k"].ThroughputTPS)
	}
}

// A schema-2 file from before the prefill weight has no prefill_pins
// bucket: it opens as it is, gains the bucket, and keeps its records.
func TestPrefillPinsBucketAddedToOlderFile(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if err := b.SavePin("k", 1.5); err != nil {
		t.Fatal(err)
	}
	b.Close()
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketPrefillPins) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	b = open(t, dir)
	defer b.Close()
	if err := b.SavePrefillPin("k", 2.5); err != nil {
		t.Fatal(err)
	}
	st, err := b.Load()
	if err != nil || st.Pins["k"] != 1.5 || st.PrefillPins["k"] != 2.5 {
		t.Errorf("pins %v, prefill pins %v (%v)", st.Pins, st.PrefillPins, err)
	}
}

// A damaged record fails closed: a worker whose stored decision cannot be
// read is held (it may have been a hold), and a node name whose record
// cannot be read stays bound, damaged, until an admin acts. Before issue
// 25 both were dropped: the held worker returned to traffic, the name
// went to whoever said it first.
func TestDamagedRecordsFailClosed(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, err := range []error{
		b.SaveDecision("held-worker", fleet.DecisionHold),
		b.SaveNode(nodes.Record{Name: "gpu-a", State: nodes.StateEnrolled, CredentialSHA256: strings.Repeat("ab", 32), Since: at, LastSeen: at}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	changeBytes(t, dir, map[string]string{`"hold"`: `"hald"`, strings.Repeat("ab", 32): strings.Repeat("cd", 32)})
	b = open(t, dir)
	defer b.Close()
	st, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := b.LoadNodes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after damage: decision %q, node %+v", st.Decisions["held-worker"], ns["gpu-a"])
	if st.Decisions["held-worker"] != fleet.DecisionHold {
		t.Errorf("the held worker's damaged decision loads as %q, want %q", st.Decisions["held-worker"], fleet.DecisionHold)
	}
	if r, ok := ns["gpu-a"]; !ok || r.State != nodes.StateDamaged || r.CredentialSHA256 != "" {
		t.Errorf("the damaged node record loads as %+v (present %v), want gpu-a damaged", r, ok)
	}
}

// changeBytes replaces, in the closed state file under dir, every copy of
// each key by its value: copy-on-write leaves older copies of a page
// behind, so each one is changed.
func changeBytes(t *testing.T, dir string, repl map[string]string) {
	t.Helper()
	path := filepath.Join(dir, FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for old, new := range repl {
		if !bytes.Contains(data, []byte(old)) {
			t.Fatalf("%q is not in the file", old)
		}
		data = bytes.ReplaceAll(data, []byte(old), []byte(new))
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
