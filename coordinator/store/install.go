package store

import bolt "go.etcd.io/bbolt"

// ApproveNewNodesByDefault reports whether the state file was begun as a
// new install by a heft that approves new node names by default: then
// approve_new_nodes, when the configuration does not say, is on. A state
// file from before (an upgrade) keeps the old default, off, so that an
// upgrade does not start holding every new host's agent pending.
func (b *Bolt) ApproveNewNodesByDefault() bool {
	on := false
	_ = b.db.View(func(tx *bolt.Tx) error {
		on = string(tx.Bucket(bucketMeta).Get(keyApproveNew)) == "true"
		return nil
	})
	return on
}
