package fleet

import (
	"container/heap"
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
// the oldest going first (tombAge finds it without a scan, as a full store
// would cost 50,000 steps per new tomb under the fleet's lock), and they
// are kept in the store (TombStore), so a coordinator restart keeps them.

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
	for len(f.keyTombs) >= f.cfg.MaxKeyTombs {
		oldest, ok := f.tombAge.oldest()
		if !ok || !f.unbury(oldest.key) {
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
	f.tombAge.set(key, t.Forgotten)
	if f.tombsOf[t.Node] == nil {
		f.tombsOf[t.Node] = map[string]bool{}
	}
	f.tombsOf[t.Node][key] = true
}

// unburyOldest removes the oldest tomb among keys (a node's, at most
// MaxKeysPerNode); false when there was none.
func unburyOldest(f *Fleet, keys map[string]bool) bool {
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
	f.tombAge.remove(key)
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

// sweepTombs removes the tombs past KeyTombTTL, oldest first: it costs
// the tombs it removes, not every tomb held.
func (f *Fleet) sweepTombs(now time.Time) {
	for {
		oldest, ok := f.tombAge.oldest()
		if !ok || now.Sub(oldest.forgotten) < f.cfg.KeyTombTTL || !f.unbury(oldest.key) {
			return
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

// tombAge orders the tombs by when they were forgotten, then by key: a
// heap indexed by key, so that finding the oldest costs nothing and
// adding or removing one costs a logarithm of their number.
type tombQueue struct {
	items []tombItem
	at    map[string]int // items' index by key
}

type tombItem struct {
	key       string
	forgotten time.Time
}

// set puts key in the queue at forgotten, or moves it there.
func (q *tombQueue) set(key string, forgotten time.Time) {
	if q.at == nil {
		q.at = map[string]int{}
	}
	if i, ok := q.at[key]; ok {
		q.items[i].forgotten = forgotten
		heap.Fix(q, i)
		return
	}
	heap.Push(q, tombItem{key: key, forgotten: forgotten})
}

// remove takes key out of the queue, if it is there.
func (q *tombQueue) remove(key string) {
	if i, ok := q.at[key]; ok {
		heap.Remove(q, i)
	}
}

// oldest is the first tomb forgotten (the least key among equals).
func (q *tombQueue) oldest() (tombItem, bool) {
	if len(q.items) == 0 {
		return tombItem{}, false
	}
	return q.items[0], true
}

// Len, Less, Swap, Push and Pop are heap.Interface's.
func (q *tombQueue) Len() int { return len(q.items) }

func (q *tombQueue) Less(i, j int) bool {
	a, b := q.items[i], q.items[j]
	return a.forgotten.Before(b.forgotten) || a.forgotten.Equal(b.forgotten) && a.key < b.key
}

func (q *tombQueue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.at[q.items[i].key], q.at[q.items[j].key] = i, j
}

func (q *tombQueue) Push(x any) {
	it := x.(tombItem)
	q.at[it.key] = len(q.items)
	q.items = append(q.items, it)
}

func (q *tombQueue) Pop() any {
	n := len(q.items) - 1
	it := q.items[n]
	q.items[n] = tombItem{}
	q.items = q.items[:n]
	delete(q.at, it.key)
	return it
}
