package fleet

import (
	"slices"
	"time"
)

// A capacity key the fleet forgets (its worker gone for ForgetAfter, its
// measurements past CacheTTL) leaves a tomb: which node owned it, and
// when it was forgotten. For KeyTombTTL after that no other node may
// claim it, so a host that stays away a day finds its engine still its own
// when it returns; the owner claims it back at once. An admin who
// releases or decommissions the node (ForgetNode) releases its tombs with
// it. Tombs are bounded: MaxKeysPerNode per node and MaxKeyTombs in all,
// the oldest going first, and they are kept in the store (TombStore), so
// a coordinator restart keeps them.

// KeyTomb is the owner a forgotten capacity key had. Its JSON form is
// what the store writes.
type KeyTomb struct {
	Node      string    `json:"node"`
	Forgotten time.Time `json:"forgotten"`
}

// TombStore keeps key tombs. A Store that is not one keeps them in memory
// only, until a restart.
type TombStore interface {
	SaveKeyTomb(key string, t KeyTomb) error
	DeleteKeyTomb(key string) error
}

// tombWrite is a tomb to store (tomb set) or delete once the lock is
// released.
type tombWrite struct {
	key  string
	tomb *KeyTomb
}

// keyTomb is the live tomb of key at now, if any.
func (f *Fleet) keyTomb(key string, now time.Time) (KeyTomb, bool) {
	t, ok := f.keyTombs[key]
	if !ok || now.Sub(t.Forgotten) >= f.cfg.KeyTombTTL {
		return KeyTomb{}, false
	}
	return t, true
}

// bury leaves node's tomb on key, forgotten at now, making room within
// the bounds first. The caller holds mu.
func (f *Fleet) bury(key, node string, now time.Time) {
	if f.cfg.KeyTombTTL <= 0 || f.cfg.MaxKeyTombs <= 0 || f.cfg.MaxKeysPerNode <= 0 || node == "" {
		return
	}
	f.unbury(key)
	for len(f.tombsOf[node]) >= f.cfg.MaxKeysPerNode {
		if !unburyOldest(f, f.tombsOf[node]) {
			break
		}
	}
	for len(f.keyTombs) >= f.cfg.MaxKeyTombs { // a scan of them all, only when they are full
		if !unburyOldest(f, f.keyTombs) {
			break
		}
	}
	t := KeyTomb{Node: node, Forgotten: now}
	f.entomb(key, t)
	f.tombWrites = append(f.tombWrites, tombWrite{key: key, tomb: &t})
}

// entomb records t on key in memory. The caller holds mu.
func (f *Fleet) entomb(key string, t KeyTomb) {
	f.keyTombs[key] = t
	if f.tombsOf[t.Node] == nil {
		f.tombsOf[t.Node] = map[string]bool{}
	}
	f.tombsOf[t.Node][key] = true
}

// unburyOldest removes the oldest tomb among keys (a map keyed by
// capacity key: a node's, or all of them); false when there was none.
func unburyOldest[V any](f *Fleet, keys map[string]V) bool {
	victim, oldest := "", time.Time{}
	for k := range keys {
		at := f.keyTombs[k].Forgotten
		if victim == "" || at.Before(oldest) || at.Equal(oldest) && k < victim {
			victim, oldest = k, at
		}
	}
	return f.unbury(victim)
}

// unbury removes key's tomb, if any, and says whether it did. The caller
// holds mu.
func (f *Fleet) unbury(key string) bool {
	t, ok := f.keyTombs[key]
	if !ok {
		return false
	}
	delete(f.keyTombs, key)
	if delete(f.tombsOf[t.Node], key); len(f.tombsOf[t.Node]) == 0 {
		delete(f.tombsOf, t.Node)
	}
	f.tombWrites = append(f.tombWrites, tombWrite{key: key})
	return true
}

// unburyNode removes every tomb of node: an admin released its name.
func (f *Fleet) unburyNode(node string) {
	for k := range f.tombsOf[node] {
		f.unbury(k)
	}
}

// sweepTombs removes the tombs past KeyTombTTL.
func (f *Fleet) sweepTombs(now time.Time) {
	for k := range f.keyTombs {
		if _, ok := f.keyTomb(k, now); !ok {
			f.unbury(k)
		}
	}
}

// restoreTombs takes the stored tombs that still hold at start: not past
// KeyTombTTL, on a key no node owns now, within the bounds (the newest
// kept). The others are deleted from the store.
func (f *Fleet) restoreTombs(stored map[string]KeyTomb, start time.Time) {
	keys := make([]string, 0, len(stored))
	for k := range stored {
		keys = append(keys, k)
	}
	// Newest first, so that the bounds keep the newest.
	slices.SortFunc(keys, func(a, b string) int { return stored[b].Forgotten.Compare(stored[a].Forgotten) })
	perNode := map[string]int{}
	for _, k := range keys {
		t := stored[k]
		_, owned := f.owner[k]
		if owned || t.Node == "" || start.Sub(t.Forgotten) >= f.cfg.KeyTombTTL || perNode[t.Node] >= f.cfg.MaxKeysPerNode || len(f.keyTombs) >= f.cfg.MaxKeyTombs {
			f.tombWrites = append(f.tombWrites, tombWrite{key: k})
			continue
		}
		perNode[t.Node]++
		f.entomb(k, t)
	}
}

// writeTombs stores the tomb writes queued under the lock.
func (f *Fleet) writeTombs(ws []tombWrite) {
	ts, ok := f.st.(TombStore)
	if !ok {
		return
	}
	for _, w := range ws {
		var err error
		if w.tomb != nil {
			err = ts.SaveKeyTomb(w.key, *w.tomb)
		} else {
			err = ts.DeleteKeyTomb(w.key)
		}
		if err != nil {
			// Held in memory all the same; a tomb not deleted is deleted
			// at the next start, when it no longer holds.
			f.log.Warn("could not store a forgotten capacity key's owner", "capacity_key", w.key, "error", err)
		}
	}
}
