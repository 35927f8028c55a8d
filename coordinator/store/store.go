// Package store keeps the coordinator's state in one bbolt file under
// state_dir: admin pins and admit/hold decisions, the latest measurement of
// every capacity key with a bounded history, and what was last known about
// each worker.
//
// Every write is one bbolt transaction, synced to disk before it returns,
// so an acknowledged write survives a crash. A state file this version
// cannot read (a newer schema, corruption, a lock held by another process)
// is refused at Open with an error that says what to do, and is never
// written to.
package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"heft/coordinator/fleet"
	"heft/shared/wire"
)

// SchemaVersion is the layout of the state file this code writes. A file
// with a higher number was written by a newer heft and is refused.
const SchemaVersion = 1

// FileName is the state file's name inside state_dir.
const FileName = "heft.db"

// lockTimeout is how long Open waits for another process's lock; tests
// shorten it.
var lockTimeout = 2 * time.Second

var (
	bucketMeta      = []byte("meta")
	bucketPins      = []byte("pins")
	bucketDecisions = []byte("decisions")
	bucketLatest    = []byte("latest")
	bucketHistory   = []byte("history")
	bucketWorkers   = []byte("workers")
	keySchema       = []byte("schema_version")

	allBuckets = [][]byte{bucketMeta, bucketPins, bucketDecisions, bucketLatest, bucketHistory, bucketWorkers}
)

var _ fleet.Store = (*Bolt)(nil)

// Bolt is the bbolt-backed store, a fleet.Store. It is safe for
// concurrent use.
type Bolt struct {
	db     *bolt.DB
	path   string
	logger hclog.Logger
}

// Open opens (or creates) dir/heft.db. It refuses, without writing to it,
// a file from a newer schema, a corrupt file, and a file locked by another
// process.
func Open(dir string, logger hclog.Logger) (*Bolt, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if dir == "" {
		return nil, errors.New("store: state_dir is empty")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create state_dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	info, err := os.Stat(path)
	switch {
	case err == nil && !info.Mode().IsRegular():
		return nil, fmt.Errorf("store: state file %s is not a regular file", path)
	case err == nil && info.Size() > 0:
		// Check the file read-only first: bbolt may write to a file it
		// opens for writing, and a file we refuse must stay as it was.
		if err := verify(path, info.Size()); err != nil {
			return nil, err
		}
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("store: state file %s: %w", path, err)
	}

	db, err := openGuarded(path, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, err
	}
	b := &Bolt{db: db, path: path, logger: logger.Named("store")}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keySchema); v != nil {
			return checkSchema(path, v)
		}
		return meta.Put(keySchema, []byte(fmt.Sprint(SchemaVersion)))
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: initialise %s: %w", path, err)
	}
	return b, nil
}

// openGuarded opens the file with bbolt, turning a lock timeout, a
// corruption error or a panic into an error that says what to do.
func openGuarded(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	db, err = bolt.Open(path, 0o600, opts)
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("store: state file %s is locked by another process (is another heft-coordinator using this state_dir?)", path)
	case errors.As(err, new(*fs.PathError)), errors.As(err, new(syscall.Errno)):
		return nil, fmt.Errorf("store: open state file %s: %w", path, err)
	default:
		// ErrInvalid, ErrChecksum, ErrVersionMismatch, "file size too small"...
		return nil, corrupt(path, err)
	}
}

// verify opens the file read-only and reads every page of it, so that
// corruption shows up here as an error rather than later as a crash.
// bbolt reads the file through a memory map and panics (or faults) on some
// corruptions; both are turned into the corrupt error.
func verify(path string, size int64) (err error) {
	db, err := openGuarded(path, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: lockTimeout})
	if err != nil {
		return err
	}
	defer db.Close()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		if tx.Size() > size {
			return corrupt(path, fmt.Errorf("its pages reach %d bytes but the file has %d: it was truncated", tx.Size(), size))
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
			if empty {
				return nil // created, but the first write never committed
			}
			return fmt.Errorf("store: %s is a bbolt file but not a heft state file (no %q bucket); move it aside or choose another state_dir", path, bucketMeta)
		}
		if v := meta.Get(keySchema); v != nil {
			if err := checkSchema(path, v); err != nil {
				return err
			}
		}
		// Touch every page in this goroutine, where a fault is recoverable,
		// before bbolt's own consistency check runs in a goroutine of its own.
		if err := tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) }); err != nil {
			return corrupt(path, err)
		}
		// Drain the channel: the check goroutine reads the map until it ends.
		var first error
		for err := range tx.Check() {
			if first == nil {
				first = err
			}
		}
		if first != nil {
			return corrupt(path, first)
		}
		return nil
	})
}

func walk(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walk(nb)
			}
		}
		return nil
	})
}

func checkSchema(path string, v []byte) error {
	var n int
	if err := json.Unmarshal(v, &n); err != nil {
		return corrupt(path, fmt.Errorf("schema version %q is not a number", v))
	}
	if n > SchemaVersion {
		return fmt.Errorf("store: state file %s has schema version %d, this heft-coordinator reads up to version %d: "+
			"run the newer heft-coordinator, or move the file aside to start fresh (pins, decisions and cached measurements would be lost)",
			path, n, SchemaVersion)
	}
	if n < 1 {
		return corrupt(path, fmt.Errorf("schema version %d", n))
	}
	return nil
}

func corrupt(path string, err error) error {
	return fmt.Errorf("store: state file %s is corrupt: %v; move it aside to start fresh (pins, decisions and cached measurements would be lost)", path, err)
}

// Path is the state file's path.
func (b *Bolt) Path() string { return b.path }

// Close releases the file.
func (b *Bolt) Close() error {
	return b.db.Close()
}

// Load reads the whole state. A record that fails to decode or validate is
// skipped with a logged warning, so one bad entry does not stop a start.
func (b *Bolt) Load() (fleet.State, error) {
	st := fleet.State{
		Pins:      map[string]float64{},
		Decisions: map[string]string{},
		Latest:    map[string]wire.Measurement{},
		History:   map[string][]wire.Measurement{},
		Workers:   map[string]fleet.WorkerRecord{},
	}
	err := b.db.View(func(tx *bolt.Tx) error {
		_ = tx.Bucket(bucketPins).ForEach(func(k, v []byte) error {
			var w float64
			if err := json.Unmarshal(v, &w); err != nil || checkWeight(w) != nil {
				b.skip("pin", k, v, err)
				return nil
			}
			st.Pins[string(k)] = w
			return nil
		})
		_ = tx.Bucket(bucketDecisions).ForEach(func(k, v []byte) error {
			var d string
			if err := json.Unmarshal(v, &d); err != nil || checkDecision(d) != nil {
				b.skip("decision", k, v, err)
				return nil
			}
			st.Decisions[string(k)] = d
			return nil
		})
		_ = tx.Bucket(bucketLatest).ForEach(func(k, v []byte) error {
			m, err := decodeMeasurement(k, v)
			if err != nil {
				b.skip("measurement", k, v, err)
				return nil
			}
			st.Latest[string(k)] = m
			return nil
		})
		hist := tx.Bucket(bucketHistory)
		_ = hist.ForEachBucket(func(key []byte) error {
			var list []wire.Measurement
			_ = hist.Bucket(key).ForEach(func(seq, v []byte) error {
				m, err := decodeMeasurement(key, v)
				if err != nil {
					b.skip("history entry", key, v, err)
					return nil
				}
				list = append(list, m)
				return nil
			})
			if len(list) > 0 {
				st.History[string(key)] = list
			}
			return nil
		})
		_ = tx.Bucket(bucketWorkers).ForEach(func(k, v []byte) error {
			var r fleet.WorkerRecord
			err := json.Unmarshal(v, &r)
			if err == nil {
				err = checkRecord(r)
			}
			if err == nil && r.ID != string(k) {
				err = fmt.Errorf("record id %q under key %q", r.ID, k)
			}
			if err != nil {
				b.skip("worker", k, v, err)
				return nil
			}
			st.Workers[r.ID] = r
			return nil
		})
		return nil
	})
	if err != nil {
		return fleet.State{}, fmt.Errorf("store: load %s: %w", b.path, err)
	}
	return st, nil
}

func (b *Bolt) skip(what string, key, value []byte, err error) {
	if err == nil {
		err = errors.New("value out of range")
	}
	b.logger.Warn("skipping unreadable "+what+" in state file", "key", string(key), "value", truncate(value), "error", err)
}

func truncate(v []byte) string { return wire.Clip(string(v), 200) }

func decodeMeasurement(key, v []byte) (wire.Measurement, error) {
	var m wire.Measurement
	if err := json.Unmarshal(v, &m); err != nil {
		return m, err
	}
	if err := m.Validate(); err != nil {
		return m, err
	}
	if m.CapacityKey != string(key) {
		return m, fmt.Errorf("measurement for %q under key %q", m.CapacityKey, key)
	}
	return m, nil
}

// SavePin records an admin's weight for a worker. The weight must be a
// finite number above zero.
func (b *Bolt) SavePin(id string, w float64) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("store: save pin: %w", err)
	}
	if err := checkWeight(w); err != nil {
		return fmt.Errorf("store: save pin for %q: %w", id, err)
	}
	return b.put("save pin", bucketPins, id, w)
}

// DeletePin clears a pin; clearing one that is not there is not an error.
func (b *Bolt) DeletePin(id string) error {
	return b.delete("delete pin", bucketPins, id)
}

// SaveDecision records an admin's "admit" or "hold" for a worker.
func (b *Bolt) SaveDecision(id, decision string) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("store: save decision: %w", err)
	}
	if err := checkDecision(decision); err != nil {
		return fmt.Errorf("store: save decision for %q: %w", id, err)
	}
	return b.put("save decision", bucketDecisions, id, decision)
}

// DeleteDecision clears a decision.
func (b *Bolt) DeleteDecision(id string) error {
	return b.delete("delete decision", bucketDecisions, id)
}

// SaveMeasurement makes m the latest measurement of its capacity key and
// appends it to that key's history, keeping the newest historyLen entries,
// in one transaction.
func (b *Bolt) SaveMeasurement(m wire.Measurement, historyLen int) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("store: save measurement: %w", err)
	}
	if historyLen < 1 {
		return fmt.Errorf("store: save measurement: history length %d, need at least 1", historyLen)
	}
	v, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("store: save measurement: %w", err)
	}
	key := []byte(m.CapacityKey)
	// Batch: concurrent writers (many agents reporting at once) share one
	// commit and one disk sync; each still returns only once its write is
	// durable. The function may run twice if a shared commit fails, so it
	// only puts and trims.
	err = b.db.Batch(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketLatest).Put(key, v); err != nil {
			return err
		}
		hb, err := tx.Bucket(bucketHistory).CreateBucketIfNotExists(key)
		if err != nil {
			return err
		}
		seq, err := hb.NextSequence()
		if err != nil {
			return err
		}
		if err := hb.Put(binary.BigEndian.AppendUint64(nil, seq), v); err != nil {
			return err
		}
		// Keys are big-endian sequence numbers, so the cursor walks oldest
		// first. Collect before deleting: a cursor skips after a Delete.
		var keys [][]byte
		_ = hb.ForEach(func(k, _ []byte) error { keys = append(keys, bytes.Clone(k)); return nil })
		for _, k := range keys[:max(0, len(keys)-historyLen)] {
			if err := hb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: save measurement for %q: %w", m.CapacityKey, err)
	}
	return nil
}

// SaveWorker records what is known about a worker.
func (b *Bolt) SaveWorker(r fleet.WorkerRecord) error {
	if err := checkRecord(r); err != nil {
		return fmt.Errorf("store: save worker: %w", err)
	}
	return b.put("save worker", bucketWorkers, r.ID, r)
}

func (b *Bolt) put(what string, bucket []byte, key string, value any) error {
	v, err := json.Marshal(value)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	err = b.db.Batch(func(tx *bolt.Tx) error { // see SaveMeasurement
		return tx.Bucket(bucket).Put([]byte(key), v)
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
	err := b.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("store: %s for %q: %w", what, key, err)
	}
	return nil
}

func checkID(id string) error {
	if id == "" {
		return errors.New("empty worker id")
	}
	if len(id) > wire.MaxStringBytes {
		return fmt.Errorf("worker id of %d bytes, at most %d", len(id), wire.MaxStringBytes)
	}
	return nil
}

func checkWeight(w float64) error {
	if math.IsNaN(w) || math.IsInf(w, 0) || w <= 0 {
		return fmt.Errorf("weight %v is not a finite number above zero", w)
	}
	return nil
}

func checkDecision(d string) error {
	if d != fleet.DecisionAdmit && d != fleet.DecisionHold {
		return fmt.Errorf("decision %q is neither %q nor %q", d, fleet.DecisionAdmit, fleet.DecisionHold)
	}
	return nil
}

func checkRecord(r fleet.WorkerRecord) error {
	if err := checkID(r.ID); err != nil {
		return err
	}
	return wire.CheckRanks(r.Ranks)
}
