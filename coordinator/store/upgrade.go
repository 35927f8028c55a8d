package store

import (
	"bytes"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"heft/coordinator/fleet"
	"heft/coordinator/nodes"
)

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
