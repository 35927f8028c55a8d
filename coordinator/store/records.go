package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"heft/coordinator/fleet"
	"heft/shared/wire"
)

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

// SaveDecision records an admin's "admit", "hold" or "hold_below_floor"
// for a worker.
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

// SaveKeyTomb records which node owned a forgotten capacity key
// (fleet.TombStore).
func (b *Bolt) SaveKeyTomb(key string, t fleet.KeyTomb) error {
	if err := checkID(key); err != nil {
		return fmt.Errorf("store: save key tomb: %w", err)
	}
	return b.put("save key tomb", bucketKeyTombs, key, t)
}

// DeleteKeyTomb forgets a forgotten key's owner (fleet.TombStore).
func (b *Bolt) DeleteKeyTomb(key string) error {
	return b.delete("delete key tomb", bucketKeyTombs, key)
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
	if d != fleet.DecisionAdmit && d != fleet.DecisionHold && d != fleet.DecisionHoldBelowFloor {
		return fmt.Errorf("decision %q is not %q, %q or %q", d, fleet.DecisionAdmit, fleet.DecisionHold, fleet.DecisionHoldBelowFloor)
	}
	return nil
}

func checkRecord(r fleet.WorkerRecord) error {
	if err := checkID(r.ID); err != nil {
		return err
	}
	return wire.CheckRanks(r.Ranks)
}
