// Package store keeps the coordinator's state in one bbolt file under
// state_dir: admin pins (of the decode and the prefill weight) and
// admit/hold decisions, the latest measurement of every capacity key with
// a bounded history, what was last known about each worker, the owners of
// forgotten capacity keys (fleet.KeyTomb), and the node records
// (enrolment and credential hashes).
//
// Every write is one bbolt transaction, synced to disk before it returns,
// so an acknowledged write survives a crash. Every value carries a
// checksum of its bucket, key and bytes: a record whose bytes changed on
// disk (a flipped digit in a pin or a throughput) fails it and is dropped
// with a warning, never served. A state file this version cannot read (a
// newer schema, corruption, a lock held by another process) is refused at
// Open with an error that says what to do, and is never written to; so
// are a 0-byte file and a heft file that lost a bucket, which would
// otherwise start blank and drop every pin, unless Open is told to
// initialise (heft-coordinator --init). A file of schema 1 (before
// checksums) is copied aside and upgraded in one transaction.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
)

// SchemaVersion is the layout of the state file this code writes. A file
// with a higher number was written by a newer heft and is refused.
// Version 2 added a checksum to every value and the nodes bucket.
const SchemaVersion = 2

// FileName is the state file's name inside state_dir.
const FileName = "heft.db"

// lockTimeout is how long Open waits for another process's lock; tests
// shorten it.
var lockTimeout = 2 * time.Second

var (
	bucketMeta = []byte("meta")
	bucketPins = []byte("pins")
	// bucketPrefillPins holds the prefill weight's pins. A file from before
	// it gains it at Open; an older coordinator ignores it.
	bucketPrefillPins = []byte("prefill_pins")
	bucketDecisions   = []byte("decisions")
	bucketLatest      = []byte("latest")
	bucketHistory     = []byte("history")
	bucketWorkers     = []byte("workers")
	bucketNodes       = []byte("nodes")
	bucketAudit       = []byte("audit") // audit.go
	// bucketKeyTombs holds the owners of forgotten capacity keys
	// (fleet.KeyTomb), by key.
	bucketKeyTombs = []byte("key_tombs")
	keySchema      = []byte("schema_version")
	// keyApproveNew marks a state file begun by a heft whose new installs
	// approve new node names by default (install.go).
	keyApproveNew = []byte("approve_new_nodes_default")

	allBuckets = [][]byte{bucketMeta, bucketPins, bucketPrefillPins, bucketDecisions, bucketLatest, bucketHistory, bucketWorkers, bucketNodes, bucketAudit,
		bucketKeyTombs}
	// dataBuckets hold checksummed values (history's are in sub-buckets).
	dataBuckets = [][]byte{bucketPins, bucketPrefillPins, bucketDecisions, bucketLatest, bucketWorkers, bucketNodes, bucketAudit, bucketKeyTombs}
	// laterBuckets came after their schema: a file of that schema may lack
	// them, and gains them empty at Open (an older coordinator ignores
	// them), where a missing bucket of the schema means lost records.
	laterBuckets = [][]byte{bucketPrefillPins, bucketAudit, bucketKeyTombs}
)

// ErrRefused marks a state file Open will not use as it is: corrupt, from
// a newer heft, empty or missing a bucket. Restarting will not help; a
// person must look (heft-coordinator exits 78, which its unit does not
// restart).
var ErrRefused = errors.New("state file refused")

var (
	_ fleet.Store     = (*Bolt)(nil)
	_ fleet.TombStore = (*Bolt)(nil)
	_ nodes.Store     = (*Bolt)(nil)
)

// Bolt is the bbolt-backed store, a fleet.Store. It is safe for
// concurrent use.
type Bolt struct {
	db     *bolt.DB
	path   string
	logger hclog.Logger
}

// Path is the state file's path.
func (b *Bolt) Path() string { return b.path }

// Close releases the file.
func (b *Bolt) Close() error {
	return b.db.Close()
}

func (b *Bolt) put(what string, bucket []byte, key string, value any) error {
	v, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	err = b.db.Batch(func(tx *bolt.Tx) error { // see SaveMeasurement
		return tx.Bucket(bucket).Put([]byte(key), seal(bucket, []byte(key), v))
	})
	if err != nil {
		return fmt.Errorf("store: %s for %q: %w", what, key, err)
	}
	return nil
}

func (b *Bolt) delete(what string, bucket []byte, key string) error {
	if err := checkID(key); err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	err := b.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("store: %s for %q: %w", what, key, err)
	}
	return nil
}
