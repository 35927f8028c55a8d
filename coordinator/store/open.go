package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Option adjusts Open.
type Option func(*openOptions)

type openOptions struct{ init bool }

// Init lets Open start over on a 0-byte state file, or an empty bbolt
// file, and recreate a bucket a heft state file lost (heft-coordinator
// --init). Without it those are refused: starting blank would drop every
// pin, decision and measurement without a word.
func Init() Option { return func(o *openOptions) { o.init = true } }

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
		case 0: // a new file: a new install
			if err := meta.Put(keyApproveNew, []byte("true")); err != nil {
				return err
			}
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
