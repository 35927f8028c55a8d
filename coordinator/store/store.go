// Package store keeps the coordinator's state in one bbolt file under
// state_dir: admin pins (of the decode and the prefill weight) and
// admit/hold decisions, the latest measurement of every capacity key with
// a bounded history, what was last known about each worker, and the node
// records (enrolment and credential hashes).
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
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
	"heft/shared/wire"
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
	keySchema         = []byte("schema_version")

	allBuckets = [][]byte{bucketMeta, bucketPins, bucketPrefillPins, bucketDecisions, bucketLatest, bucketHistory, bucketWorkers, bucketNodes}
	// dataBuckets hold checksummed values (history's are in sub-buckets).
	dataBuckets = [][]byte{bucketPins, bucketPrefillPins, bucketDecisions, bucketLatest, bucketWorkers, bucketNodes}
	// laterBuckets came after their schema: a file of that schema may lack
	// them, and gains them empty at Open (an older coordinator ignores
	// them), where a missing bucket of the schema means lost records.
	laterBuckets = [][]byte{bucketPrefillPins}
)

// ErrRefused marks a state file Open will not use as it is: corrupt, from
// a newer heft, empty or missing a bucket. Restarting will not help; a
// person must look (heft-coordinator exits 78, which its unit does not
// restart).
var ErrRefused = errors.New("state file refused")

// Option adjusts Open.
type Option func(*openOptions)

type openOptions struct{ init bool }

// Init lets Open start over on a 0-byte state file, or an empty bbolt
// file, and recreate a bucket a heft state file lost (heft-coordinator
// --init). Without it those are refused: starting blank would drop every
// pin, decision and measurement without a word.
func Init() Option { return func(o *openOptions) { o.init = true } }

var (
	_ fleet.Store = (*Bolt)(nil)
	_ nodes.Store = (*Bolt)(nil)
)

// Bolt is the bbolt-backed store, a fleet.Store. It is safe for
// concurrent use.
type Bolt struct {
	db     *bolt.DB
	path   string
	logger hclog.Logger
}

// Open opens dir/heft.db, creating it when there is none. It refuses,
// without writing to it, a file from a newer schema, a corrupt file, a
// file locked by another process, and (unless Init) a 0-byte file or a
// heft file missing a bucket. A schema-1 file is copied to heft.db.schema1
// and upgraded.
func Open(dir string, logger hclog.Logger, opts ...Option) (*Bolt, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	var o openOptions
	for _, opt := range opts {
		opt(&o)
	}
	if dir == "" {
		return nil, errors.New("store: state_dir is empty")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: create state_dir: %w", err)
	}
	log := logger.Named("store")
	path := filepath.Join(dir, FileName)
	info, err := os.Stat(path)
	var found fileInfo
	switch {
	case err == nil && !info.Mode().IsRegular():
		return nil, fmt.Errorf("store: state file %s is not a regular file", path)
	case err == nil && info.Size() == 0:
		if !o.init {
			return nil, fmt.Errorf("%w: store: state file %s is empty (0 bytes): the pins, decisions and measurements it held are gone. "+
				"Restore it from a backup, or start once with --init to begin with an empty state", ErrRefused, path)
		}
		log.Warn("starting over on an empty state file (--init)", "path", path)
	case err == nil:
		// Check the file read-only first: bbolt may write to a file it
		// opens for writing, and a file we refuse must stay as it was.
		if found, err = verify(path, info.Size()); err != nil {
			return nil, err
		}
		if err := found.refuse(path, o.init); err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("store: state file %s: %w", path, err)
	}
	if found.schema == 1 {
		if err := copyFile(path, path+".schema1"); err != nil {
			return nil, fmt.Errorf("store: copy the schema-1 state file aside before upgrading it: %w", err)
		}
	}

	db, err := openGuarded(path, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, err
	}
	b := &Bolt{db: db, path: path, logger: log}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			later := slices.ContainsFunc(laterBuckets, func(l []byte) bool { return bytes.Equal(l, name) })
			if tx.Bucket(name) == nil && found.schema > 0 && !later {
				log.Warn("recreating a missing bucket of the state file (--init)", "bucket", string(name))
			}
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch found.schema {
		case 0: // a new file
			return meta.Put(keySchema, []byte(fmt.Sprint(SchemaVersion)))
		case 1:
			n, err := upgrade1(tx)
			if err != nil {
				return err
			}
			log.Info("state file upgraded to schema 2: every record checksummed, node names known from workers kept unbound",
				"path", path, "records", n, "copy_of_schema_1", path+".schema1")
			return meta.Put(keySchema, []byte(fmt.Sprint(SchemaVersion)))
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: initialise %s: %w", path, err)
	}
	return b, nil
}

// fileInfo is what verify found in an existing file.
type fileInfo struct {
	schema  int      // 0: no heft meta bucket
	empty   bool     // a bbolt file without any bucket
	missing []string // buckets a heft file lacks
}

// refuse says why Open will not use the file as it is, unless init.
func (f fileInfo) refuse(path string, init bool) error {
	switch {
	case init:
		return nil
	case f.empty:
		return fmt.Errorf("%w: store: state file %s holds no state (its first write never finished, or it was emptied); "+
			"restore it from a backup, or start once with --init to begin with an empty state", ErrRefused, path)
	case len(f.missing) > 0:
		return fmt.Errorf("%w: store: state file %s has lost its %s bucket(s): their records are gone. Restore the file from a backup, "+
			"or start once with --init to recreate them empty (the other records are kept)", ErrRefused, path, strings.Join(f.missing, ", "))
	}
	return nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// upgrade1 seals every value of a schema-1 file with its checksum and
// records the node names its workers carry as unbound nodes (known before
// node credentials: their agents bind them on first use).
func upgrade1(tx *bolt.Tx) (int, error) {
	n := 0
	reseal := func(bucket []byte, b *bolt.Bucket) error {
		type kv struct{ k, v []byte }
		var all []kv
		if err := b.ForEach(func(k, v []byte) error {
			if v != nil {
				all = append(all, kv{bytes.Clone(k), bytes.Clone(v)})
			}
			return nil
		}); err != nil {
			return err
		}
		for _, x := range all {
			if err := b.Put(x.k, seal(bucket, x.k, x.v)); err != nil {
				return err
			}
			n++
		}
		return nil
	}
	for _, name := range dataBuckets {
		if err := reseal(name, tx.Bucket(name)); err != nil {
			return n, err
		}
	}
	hist := tx.Bucket(bucketHistory)
	var keys [][]byte
	_ = hist.ForEachBucket(func(k []byte) error { keys = append(keys, bytes.Clone(k)); return nil })
	for _, k := range keys {
		if err := reseal(historyBucket(k), hist.Bucket(k)); err != nil {
			return n, err
		}
	}
	seen := map[string]time.Time{}
	_ = tx.Bucket(bucketWorkers).ForEach(func(k, v []byte) error {
		raw, err := unseal(bucketWorkers, k, v)
		if err != nil {
			return nil
		}
		var r fleet.WorkerRecord
		if json.Unmarshal(raw, &r) == nil && r.Node != "" && r.LastSeen.After(seen[r.Node]) {
			seen[r.Node] = r.LastSeen
		}
		return nil
	})
	nb := tx.Bucket(bucketNodes)
	for name, last := range seen {
		rec := nodes.Record{Name: name, State: nodes.StateUnbound, Since: last, LastSeen: last}
		v, err := json.Marshal(rec)
		if err != nil {
			return n, err
		}
		if err := nb.Put([]byte(name), seal(bucketNodes, []byte(name), v)); err != nil {
			return n, err
		}
	}
	return n, nil
}

// historyBucket is the name a history entry's checksum covers.
func historyBucket(key []byte) []byte { return append([]byte("history/"), key...) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealLen is the checksum trailer: a NUL (which JSON never holds) and
// eight hex digits of CRC-32C.
const sealLen = 9

// seal appends the checksum of bucket, key and v to v.
func seal(bucket, key, v []byte) []byte {
	out := make([]byte, 0, len(v)+sealLen)
	out = append(out, v...)
	out = append(out, 0)
	return fmt.Appendf(out, "%08x", checksum(bucket, key, v))
}

func checksum(bucket, key, v []byte) uint32 {
	h := crc32.New(castagnoli)
	h.Write(bucket)
	h.Write([]byte{0})
	h.Write(key)
	h.Write([]byte{0})
	h.Write(v)
	return h.Sum32()
}

// errChecksum is a value whose bytes are not the ones written.
var errChecksum = errors.New("the record failed its checksum: its bytes changed on disk")

// unseal checks and removes the checksum.
func unseal(bucket, key, v []byte) ([]byte, error) {
	if len(v) < sealLen || v[len(v)-sealLen] != 0 {
		return nil, errChecksum
	}
	body, sum := v[:len(v)-sealLen], v[len(v)-sealLen+1:]
	var want uint32
	if _, err := fmt.Sscanf(string(sum), "%08x", &want); err != nil || want != checksum(bucket, key, body) {
		return nil, errChecksum
	}
	return body, nil
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
// corruption shows up here as an error rather than later as a crash, and
// says what it found. bbolt reads the file through a memory map and panics
// (or faults) on some corruptions; both are turned into the corrupt error.
func verify(path string, size int64) (info fileInfo, err error) {
	db, err := openGuarded(path, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: lockTimeout})
	if err != nil {
		return info, err
	}
	defer db.Close()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Size() > size {
			return corrupt(path, fmt.Errorf("its pages reach %d bytes but the file has %d: it was truncated", tx.Size(), size))
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			info.empty = true
			_ = tx.ForEach(func([]byte, *bolt.Bucket) error { info.empty = false; return nil })
			if info.empty {
				return nil
			}
			return fmt.Errorf("%w: store: %s is a bbolt file but not a heft state file (no %q bucket); move it aside or choose another state_dir",
				ErrRefused, path, bucketMeta)
		}
		v := meta.Get(keySchema)
		if v == nil {
			return corrupt(path, errors.New("no schema version"))
		}
		n, err := checkSchema(path, v)
		if err != nil {
			return err
		}
		info.schema = n
		for _, name := range allBuckets {
			if tx.Bucket(name) == nil && !(n == 1 && bytes.Equal(name, bucketNodes)) && !slices.ContainsFunc(laterBuckets, func(l []byte) bool { return bytes.Equal(l, name) }) {
				info.missing = append(info.missing, string(name))
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
	return info, err
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

func checkSchema(path string, v []byte) (int, error) {
	var n int
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, corrupt(path, fmt.Errorf("schema version %q is not a number", v))
	}
	if n > SchemaVersion {
		return 0, fmt.Errorf("%w: store: state file %s has schema version %d, this heft-coordinator reads up to version %d: "+
			"run the newer heft-coordinator, or move the file aside to start fresh (pins, decisions and cached measurements would be lost)",
			ErrRefused, path, n, SchemaVersion)
	}
	if n < 1 {
		return 0, corrupt(path, fmt.Errorf("schema version %d", n))
	}
	return n, nil
}

func corrupt(path string, err error) error {
	return fmt.Errorf("%w: store: state file %s is corrupt: %v; move it aside to start fresh (pins, decisions and cached measurements would be lost)",
		ErrRefused, path, err)
}

// Path is the state file's path.
func (b *Bolt) Path() string { return b.path }

// Close releases the file.
func (b *Bolt) Close() error {
	return b.db.Close()
}

// Load reads the whole state. A record that fails its checksum, or to
// decode or validate, is skipped with a logged warning, so one bad entry
// is never served and does not stop a start.
func (b *Bolt) Load() (fleet.State, error) {
	st := fleet.State{
		Pins:        map[string]float64{},
		PrefillPins: map[string]float64{},
		Decisions:   map[string]string{},
		Latest:      map[string]wire.Measurement{},
		History:     map[string][]wire.Measurement{},
		Workers:     map[string]fleet.WorkerRecord{},
	}
	err := b.db.View(func(tx *bolt.Tx) error {
		for _, bucket := range [][]byte{bucketPins, bucketPrefillPins} {
			pins := st.Pins
			if string(bucket) == string(bucketPrefillPins) {
				pins = st.PrefillPins
			}
			b.each(tx.Bucket(bucket), bucket, "pin", func(k, v []byte) error {
				var w float64
				if err := json.Unmarshal(v, &w); err != nil {
					return err
				}
				if err := checkWeight(w); err != nil {
					return err
				}
				pins[string(k)] = w
				return nil
			})
		}
		b.each(tx.Bucket(bucketDecisions), bucketDecisions, "decision", func(k, v []byte) error {
			var d string
			if err := json.Unmarshal(v, &d); err != nil {
				return err
			}
			if err := checkDecision(d); err != nil {
				return err
			}
			st.Decisions[string(k)] = d
			return nil
		})
		b.each(tx.Bucket(bucketLatest), bucketLatest, "measurement", func(k, v []byte) error {
			m, err := decodeMeasurement(k, v)
			if err != nil {
				return err
			}
			st.Latest[string(k)] = m
			return nil
		})
		hist := tx.Bucket(bucketHistory)
		_ = hist.ForEachBucket(func(key []byte) error {
			var list []wire.Measurement
			b.each(hist.Bucket(key), historyBucket(key), "history entry", func(_, v []byte) error {
				m, err := decodeMeasurement(key, v)
				if err != nil {
					return err
				}
				list = append(list, m)
				return nil
			})
			if len(list) > 0 {
				st.History[string(key)] = list
			}
			return nil
		})
		b.each(tx.Bucket(bucketWorkers), bucketWorkers, "worker", func(k, v []byte) error {
			var r fleet.WorkerRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if err := checkRecord(r); err != nil {
				return err
			}
			if r.ID != string(k) {
				return fmt.Errorf("record id %q under key %q", r.ID, k)
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

// LoadNodes reads the node records, skipping (with a warning) any that
// fails its checksum or to decode.
func (b *Bolt) LoadNodes() (map[string]nodes.Record, error) {
	out := map[string]nodes.Record{}
	err := b.db.View(func(tx *bolt.Tx) error {
		b.each(tx.Bucket(bucketNodes), bucketNodes, "node", func(k, v []byte) error {
			var r nodes.Record
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if r.Name != string(k) {
				return fmt.Errorf("record of %q under key %q", r.Name, k)
			}
			out[r.Name] = r
			return nil
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: load nodes from %s: %w", b.path, err)
	}
	return out, nil
}

// each calls use with every value of a bucket whose checksum holds,
// skipping (with a warning) the values that fail it or that use refuses.
func (b *Bolt) each(bk *bolt.Bucket, name []byte, what string, use func(k, v []byte) error) {
	if bk == nil {
		return
	}
	_ = bk.ForEach(func(k, v []byte) error {
		if v == nil {
			return nil // a nested bucket
		}
		body, err := unseal(name, k, v)
		if err == nil {
			err = use(k, body)
		}
		if err != nil {
			b.skip(what, k, v, err)
		}
		return nil
	})
}

func (b *Bolt) skip(what string, key, value []byte, err error) {
	b.logger.Warn("dropping an unreadable "+what+" from the state file: it is not served", "key", truncate(key), "value", truncate(value), "error", err)
}

func truncate(v []byte) string { return wire.Clip(strings.ToValidUTF8(string(v), "?"), 200) }

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

// SavePrefillPin records an admin's prefill weight for a worker, as
// SavePin does the decode weight.
func (b *Bolt) SavePrefillPin(id string, w float64) error {
	if err := checkID(id); err != nil {
		return fmt.Errorf("store: save prefill pin: %w", err)
	}
	if err := checkWeight(w); err != nil {
		return fmt.Errorf("store: save prefill pin for %q: %w", id, err)
	}
	return b.put("save prefill pin", bucketPrefillPins, id, w)
}

// DeletePrefillPin clears a prefill pin; clearing one that is not there is
// not an error.
func (b *Bolt) DeletePrefillPin(id string) error {
	return b.delete("delete prefill pin", bucketPrefillPins, id)
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
	hv, err := json.Marshal(fleet.HistoryEntry(m))
	if err != nil {
		return fmt.Errorf("store: save measurement: %w", err)
	}
	key := []byte(m.CapacityKey)
	// Batch: concurrent writers (many agents reporting at once) share one
	// commit and one disk sync; each still returns only once its write is
	// durable. The function may run twice if a shared commit fails, so it
	// only puts and trims.
	err = b.db.Batch(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketLatest).Put(key, seal(bucketLatest, key, v)); err != nil {
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
		seqKey := binary.BigEndian.AppendUint64(nil, seq)
		if err := hb.Put(seqKey, seal(historyBucket(key), seqKey, hv)); err != nil {
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

// DeleteWorker forgets a worker's record.
func (b *Bolt) DeleteWorker(id string) error {
	return b.delete("delete worker", bucketWorkers, id)
}

// DeleteMeasurements forgets a capacity key's latest measurement and its
// history.
func (b *Bolt) DeleteMeasurements(key string) error {
	if err := checkID(key); err != nil {
		return fmt.Errorf("store: delete measurements: %w", err)
	}
	err := b.db.Batch(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketLatest).Delete([]byte(key)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketHistory).DeleteBucket([]byte(key)); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: delete measurements of %q: %w", key, err)
	}
	return nil
}

// SaveNode records a node (nodes.Store).
func (b *Bolt) SaveNode(r nodes.Record) error {
	if err := checkID(r.Name); err != nil {
		return fmt.Errorf("store: save node: %w", err)
	}
	return b.put("save node", bucketNodes, r.Name, r)
}

// DeleteNode forgets a node (nodes.Store).
func (b *Bolt) DeleteNode(name string) error {
	return b.delete("delete node", bucketNodes, name)
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
