package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"heft/coordinator/audit"
)

var _ audit.Store = (*Bolt)(nil)

// auditKey orders entries by sequence number: 8 bytes, big-endian.
func auditKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// SaveAudit appends an audit entry and drops the oldest beyond keep
// (audit.Store).
func (b *Bolt) SaveAudit(e audit.Entry, keep int) error {
	v, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("store: save audit entry: %w", err)
	}
	err = b.db.Batch(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketAudit)
		k := auditKey(e.Seq)
		if err := bk.Put(k, seal(bucketAudit, k, v)); err != nil {
			return err
		}
		if e.Seq <= uint64(keep) {
			return nil
		}
		// Drop what falls out of the newest keep: the entries before
		// Seq-keep+1, oldest first (a restart's first saves drop several).
		c, oldest := bk.Cursor(), auditKey(e.Seq-uint64(keep)+1)
		for k, _ := c.First(); k != nil && bytes.Compare(k, oldest) < 0; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: save audit entry %d: %w", e.Seq, err)
	}
	return nil
}

// LoadAudit reads the audit entries, oldest first, skipping (with a
// warning) any that fails its checksum or to decode.
func (b *Bolt) LoadAudit() ([]audit.Entry, error) {
	var out []audit.Entry
	err := b.db.View(func(tx *bolt.Tx) error {
		b.each(tx.Bucket(bucketAudit), bucketAudit, "audit entry", func(k, v []byte) error {
			var e audit.Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			if len(k) != 8 || binary.BigEndian.Uint64(k) != e.Seq {
				return fmt.Errorf("entry %d under key %x", e.Seq, k)
			}
			out = append(out, e)
			return nil
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: load audit from %s: %w", b.path, err)
	}
	return out, nil
}
