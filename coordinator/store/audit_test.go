package store

import (
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"heft/coordinator/audit"
)

// Audit entries survive a reopen, oldest first, and only the newest keep
// stay; a file from before the audit bucket gains it.
func TestAuditRoundTrip(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	b.Close()
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketAudit) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	b = open(t, dir)
	at := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	for seq := uint64(1); seq <= 5; seq++ {
		e := audit.Entry{Seq: seq, Time: at, Token: "admin", Source: "10.0.0.9", Action: "approve", Target: "gpu-" + string(rune('a'+seq-1)),
			Old: "pending", New: "enrolled"}
		if err := b.SaveAudit(e, 3); err != nil {
			t.Fatal(err)
		}
	}
	b.Close()
	b = open(t, dir)
	defer b.Close()
	es, err := b.LoadAudit()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 3 || es[0].Seq != 3 || es[2].Seq != 5 || es[2].Target != "gpu-e" || es[2].Source != "10.0.0.9" || !es[2].Time.Equal(at) {
		t.Errorf("loaded %+v, want entries 3..5", es)
	}
}
