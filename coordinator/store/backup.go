package store

import (
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Backup writes a consistent copy of the whole state file to w, from one
// read transaction: writers go on meanwhile (bbolt serves readers beside
// the writer), and the copy is the state as of the transaction's start.
// size is called with the copy's length before the first byte is
// written, so that an HTTP answer can announce it and a cut copy shows.
func (b *Bolt) Backup(w io.Writer, size func(int64)) (int64, error) {
	var n int64
	err := b.db.View(func(tx *bolt.Tx) error {
		if size != nil {
			size(tx.Size())
		}
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("store: back up %s: %w", b.path, err)
	}
	return n, nil
}

// Check reads the state file at path read-only, every page of it, and
// says whether Open would use it as it is (without --init): a backup is
// checked with it before it replaces anything. It never writes to path.
func Check(path string) error {
	info, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("store: %w", err)
	case !info.Mode().IsRegular():
		return fmt.Errorf("store: %s is not a regular file", path)
	case info.Size() == 0:
		return fmt.Errorf("%w: store: %s is empty (0 bytes)", ErrRefused, path)
	}
	found, err := verify(path, info.Size())
	if err != nil {
		return err
	}
	return found.refuse(path, false)
}
