package store

import (
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A state file begun by this heft approves new node names by default, and
// keeps doing so across restarts; a file from before (schema 1, or schema
// 2 written before the default) does not, so an upgrade keeps its
// behaviour.
func TestApproveNewNodesByDefault(t *testing.T) {
	dir := t.TempDir()
	b := open(t, dir)
	if !b.ApproveNewNodesByDefault() {
		t.Error("a new state file does not approve new node names by default")
	}
	b.Close()
	b = open(t, dir)
	if !b.ApproveNewNodesByDefault() {
		t.Error("a restarted new install no longer approves new node names by default")
	}
	b.Close()

	// Schema 2 from before the default: the same file without the mark.
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyApproveNew) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	b = open(t, dir)
	if b.ApproveNewNodesByDefault() {
		t.Error("a state file from before the default approves new node names")
	}
	b.Close()

	// Schema 1, upgraded.
	old := t.TempDir()
	fixture, err := os.ReadFile(filepath.Join("testdata", "schema1.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, FileName), fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	b = open(t, old)
	defer b.Close()
	if b.ApproveNewNodesByDefault() {
		t.Error("an upgraded schema-1 state approves new node names")
	}
}
