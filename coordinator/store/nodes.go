package store

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"heft/coordinator/nodes"
)

// LoadNodes reads the node records. One that fails its checksum or to
// decode fails closed: its name comes back damaged (nodes.StateDamaged),
// still bound, refusing every connection until an admin releases it,
// rather than free for whoever says it first.
func (b *Bolt) LoadNodes() (map[string]nodes.Record, error) {
	out := map[string]nodes.Record{}
	err := b.db.View(func(tx *bolt.Tx) error {
		damaged := b.each(tx.Bucket(bucketNodes), bucketNodes, "node", func(k, v []byte) error {
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
		for _, k := range damaged {
			out[k] = nodes.Record{Name: k, State: nodes.StateDamaged}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: load nodes from %s: %w", b.path, err)
	}
	return out, nil
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
