package audit

import (
	"errors"
	"testing"
	"time"
)

type memStore struct {
	saved []Entry
	fail  bool
}

func (m *memStore) SaveAudit(e Entry, keep int) error {
	if m.fail {
		return errors.New("disk full")
	}
	m.saved = append(m.saved, e)
	return nil
}

func TestRecordAndPage(t *testing.T) {
	at := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	st := &memStore{}
	l := New(st, nil, func() time.Time { return at }, nil)
	for _, target := range []string{"a", "b", "c", "d", "e"} {
		l.Record(Entry{Token: "admin", Source: "10.0.0.9", Action: "approve", Target: target, Old: "pending", New: "enrolled"})
	}
	if len(st.saved) != 5 || st.saved[4].Seq != 5 || !st.saved[0].Time.Equal(at) {
		t.Fatalf("saved %+v", st.saved)
	}
	page, next := l.Page(0, 2)
	if len(page) != 2 || page[0].Target != "e" || page[1].Target != "d" || next != 4 {
		t.Fatalf("first page %+v, next %d", page, next)
	}
	page, next = l.Page(next, 2)
	if len(page) != 2 || page[0].Target != "c" || page[1].Target != "b" || next != 2 {
		t.Fatalf("second page %+v, next %d", page, next)
	}
	page, next = l.Page(next, 2)
	if len(page) != 1 || page[0].Target != "a" || next != 0 {
		t.Fatalf("last page %+v, next %d", page, next)
	}
}

// A restart continues the numbering from the stored entries, and a store
// that fails loses nothing in memory.
func TestReloadAndFailingStore(t *testing.T) {
	loaded := []Entry{{Seq: 7, Action: "pin"}, {Seq: 3, Action: "hold"}}
	st := &memStore{fail: true}
	l := New(st, loaded, nil, nil)
	e := l.Record(Entry{Action: "admit"})
	if e.Seq != 8 {
		t.Errorf("seq %d after stored 3 and 7, want 8", e.Seq)
	}
	page, _ := l.Page(0, 10)
	if len(page) != 3 || page[0].Action != "admit" || page[2].Action != "hold" {
		t.Errorf("page %+v", page)
	}
}

func TestKeepsAtMostMax(t *testing.T) {
	l := New(nil, nil, nil, nil)
	l.max = 3
	for range 5 {
		l.Record(Entry{Action: "probe"})
	}
	page, next := l.Page(0, 10)
	if len(page) != 3 || page[0].Seq != 5 || page[2].Seq != 3 || next != 0 {
		t.Errorf("page %+v next %d", page, next)
	}
}
