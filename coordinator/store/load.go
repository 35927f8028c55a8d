package store

import (
	"encoding/json"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"heft/coordinator/fleet"
	"heft/shared/wire"
)

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
		KeyTombs:    map[string]fleet.KeyTomb{},
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
		damaged := b.each(tx.Bucket(bucketDecisions), bucketDecisions, "decision", func(k, v []byte) error {
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
		// Fail closed: a decision that cannot be read may have been a
		// hold, so the worker is held until an admin decides again.
		for _, k := range damaged {
			if checkID(k) == nil {
				st.Decisions[k] = fleet.DecisionHold
				b.logger.Warn("holding a worker whose stored admin decision is damaged, until an admin admits or holds it again", "worker", truncate([]byte(k)))
			}
		}
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
		b.each(tx.Bucket(bucketKeyTombs), bucketKeyTombs, "capacity key's former owner", func(k, v []byte) error {
			var t fleet.KeyTomb
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if t.Node == "" || t.Forgotten.IsZero() {
				return fmt.Errorf("former owner %q forgotten at %s", t.Node, t.Forgotten)
			}
			st.KeyTombs[string(k)] = t
			return nil
		})
		return nil
	})
	if err != nil {
		return fleet.State{}, fmt.Errorf("store: load %s: %w", b.path, err)
	}
	return st, nil
}

// each calls use with every value of a bucket whose checksum holds,
// skipping (with a warning) the values that fail it or that use refuses,
// whose keys it returns.
func (b *Bolt) each(bk *bolt.Bucket, name []byte, what string, use func(k, v []byte) error) (damaged []string) {
	if bk == nil {
		return nil
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
			damaged = append(damaged, string(k))
		}
		return nil
	})
	return damaged
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
		// The load before a burst only explains it (a history entry keeps
		// none). One stored before the wire bounded it (a kv_usage above
		// wire.MaxKVUsage, say) costs the load, not the measurement.
		if m.LoadBefore.Validate() == nil {
			return m, err
		}
		m.LoadBefore = wire.Load{}
		if m.Validate() != nil {
			return m, err
		}
	}
	if m.CapacityKey != string(key) {
		return m, fmt.Errorf("measurement for %q under key %q", m.CapacityKey, key)
	}
	return m, nil
}
