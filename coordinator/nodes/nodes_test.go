package nodes

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/shared/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// memStore records what a registry wrote.
type memStore struct {
	mu   sync.Mutex
	recs map[string]Record
	fail error
}

func (m *memStore) SaveNode(r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.recs[r.Name] = r
	return nil
}

func (m *memStore) DeleteNode(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, name)
	return nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newRegistry(t *testing.T, cfg Config) (*Registry, *memStore, *clock) {
	t.Helper()
	st, clk := &memStore{recs: map[string]Record{}}, &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	r, err := New(cfg, st, nil, clk.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r, st, clk
}

// The credential is stored only as its hash; a restart over the stored
// records knows the node by it.
func TestEnrolStoresOnlyAHash(t *testing.T) {
	r, st, clk := newRegistry(t, DefaultConfig())
	d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true, Hostname: "a"})
	if d.Outcome != Accept || len(d.Credential) != 43 {
		t.Fatalf("enrol: %+v", d)
	}
	rec := st.recs["gpu-a"]
	if rec.State != StateEnrolled || rec.CredentialSHA256 == d.Credential || len(rec.CredentialSHA256) != 64 {
		t.Fatalf("stored %+v", rec)
	}
	again, err := New(DefaultConfig(), st, st.recs, clk.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Admit(Hello{Node: "gpu-a", Credential: d.Credential, KeepsCredential: true}); got.Outcome != Accept || got.Credential != "" {
		t.Errorf("after a restart: %+v", got)
	}
	if got := again.Admit(Hello{Node: "gpu-a", Credential: d.Credential + "x", KeepsCredential: true}); got.Outcome != Refuse || got.Label != LabelCredential {
		t.Errorf("a wrong credential: %+v", got)
	}
	if len(d.Close) > 123 {
		t.Errorf("close reason of %d bytes", len(d.Close))
	}
}

// A node unseen for ForgetAfter is forgotten; a connected one counts as
// seen; a failed store write refuses the enrolment and keeps nothing.
func TestForgetAndStoreFailure(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ForgetAfter = 48 * time.Hour
	r, st, clk := newRegistry(t, cfg)
	r.Admit(Hello{Node: "gone", KeepsCredential: true})
	r.Admit(Hello{Node: "here", KeepsCredential: true})
	clk.t = clk.t.Add(49 * time.Hour)
	r.Tick(func(n string) bool { return n == "here" }, nil)
	if _, ok := r.Get("gone"); ok {
		t.Error("a node unseen past forget_nodes_after is remembered")
	}
	if _, ok := st.recs["gone"]; ok {
		t.Error("its stored record is kept")
	}
	if rec, ok := st.recs["here"]; !ok || !rec.LastSeen.Equal(clk.t) {
		t.Errorf("the connected node's stored last-seen %v, want %v", rec.LastSeen, clk.t)
	}
	st.fail = errors.New("disk full")
	if d := r.Admit(Hello{Node: "new", KeepsCredential: true}); d.Outcome != Refuse || d.Label != LabelStore {
		t.Errorf("enrolment with a failing store: %+v", d)
	}
	if _, ok := r.Get("new"); ok {
		t.Error("a record that was not stored is kept in memory")
	}
}

// The pending list is bounded: past max_pending_nodes a new name is
// refused, and the names already waiting stay. Before issue 25 the oldest
// waiting name was forgotten for each new one.
func TestPendingIsBounded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ApproveNew, cfg.MaxPending = true, 3
	r, _, clk := newRegistry(t, cfg)
	for i := range 5 {
		clk.t = clk.t.Add(time.Minute)
		d := r.Admit(Hello{Node: fmt.Sprintf("n%d", i), KeepsCredential: true})
		switch {
		case i < 3 && (d.Outcome != Pending || d.Credential == ""):
			t.Fatalf("n%d: %+v, want pending", i, d)
		case i >= 3 && (d.Outcome != Limit || !strings.Contains(d.Reason, "max_pending_nodes")):
			t.Fatalf("n%d past the cap: %+v, want refused at max_pending_nodes", i, d)
		}
	}
	if c := r.Counts(); c[StatePending] != 3 {
		t.Errorf("%d pending, want 3", c[StatePending])
	}
	for _, kept := range []string{"n0", "n1", "n2"} {
		if _, ok := r.Get(kept); !ok {
			t.Errorf("%s, waiting first, was forgotten for a newer name", kept)
		}
	}
}

// gatedStore holds every SaveNode until release is closed, so that
// enrolments overlap as they do under load.
type gatedStore struct {
	memStore
	release chan struct{}
}

func (g *gatedStore) SaveNode(r Record) error {
	<-g.release
	return g.memStore.SaveNode(r)
}

// Issue 25: 6,134 names were left pending against a max_pending_nodes of
// 1,000 when they enrolled at once, as each was counted only once its
// record was written. The cap now holds under concurrent enrolment.
// Before: none of 200 refused while their writes were held, so all were
// to be written pending; after: 190 refused, 10 pending.
func TestPendingCapHoldsUnderConcurrentEnrolment(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ApproveNew, cfg.MaxPending = true, 10
	st := &gatedStore{memStore: memStore{recs: map[string]Record{}}, release: make(chan struct{})}
	r, err := New(cfg, st, nil, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 200 {
		wg.Go(func() {
			d := r.Admit(Hello{Node: fmt.Sprintf("flood-%03d", i), KeepsCredential: true})
			mu.Lock()
			outcomes[d.Outcome]++
			mu.Unlock()
		})
	}
	// Let the refusals come back while the first writes are held.
	testutil.Eventually(t, "the refusals", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return outcomes[Limit] == 190
	})
	close(st.release)
	wg.Wait()
	t.Logf("outcomes of 200 concurrent new names with max_pending_nodes 10: %v", outcomes)
	if c := r.Counts(); c[StatePending] != 10 || outcomes[Pending] != 10 {
		t.Errorf("%d pending (%v), want 10", c[StatePending], outcomes)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []Config{{MaxNodes: 0, MaxPending: 1, ForgetAfter: time.Hour}, {MaxNodes: 5, MaxPending: 6, ForgetAfter: time.Hour},
		{MaxNodes: 5, MaxPending: 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A damaged record keeps its name bound: every connection is refused, even
// one that could have enrolled a new name, and forget_nodes_after does not
// free it; an admin's release does. A record that fails its checks (an
// unknown state, a cut credential hash) is damaged too.
func TestDamagedRecordKeepsItsName(t *testing.T) {
	st, clk := &memStore{recs: map[string]Record{}}, &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	records := map[string]Record{
		"gpu-a": {Name: "gpu-a", State: StateDamaged},
		"gpu-b": {Name: "gpu-b", State: StateEnrolled, CredentialSHA256: "abc"},
		"gpu-c": {Name: "gpu-c", State: "bogus"},
	}
	cfg := DefaultConfig()
	cfg.ForgetAfter = time.Hour
	r, err := New(cfg, st, records, clk.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpu-a", "gpu-b", "gpu-c"} {
		for _, h := range []Hello{{Node: name, KeepsCredential: true}, {Node: name}, {Node: name, Credential: NewCredential(), KeepsCredential: true}} {
			if d := r.Admit(h); d.Outcome != Refuse || d.Label != LabelDamaged {
				t.Errorf("%s: a connection to a damaged name: %+v", name, d)
			}
		}
	}
	clk.t = clk.t.Add(2 * time.Hour)
	r.Tick(func(string) bool { return false }, nil)
	if rec, ok := r.Get("gpu-a"); !ok || rec.State != StateDamaged {
		t.Errorf("forget_nodes_after freed a damaged name: %+v %v", rec, ok)
	}
	if err := r.Release("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true}); d.Outcome != Accept || d.Credential == "" {
		t.Errorf("after an admin's release: %+v", d)
	}
}

// Binding an unbound name is not first come, first served: after an
// upgrade (a name with no address it enrolled from) an agent that keeps a
// credential is served unbound, and handed none, until an admin approves
// the bind; a name an old agent enrolled unbound binds from the address
// it enrolled from, and from nowhere else. Before issue 25 the first
// caller bound it and the real agent was refused.
func TestBindingAnUnboundNameIsNotFirstCome(t *testing.T) {
	st, clk := &memStore{recs: map[string]Record{}}, &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	upgraded := map[string]Record{"gpu-a": {Name: "gpu-a", State: StateUnbound, Since: clk.t, LastSeen: clk.t}}
	r, err := New(DefaultConfig(), st, upgraded, clk.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true, Address: "10.0.0.66"}); d.Outcome != Accept || d.Credential != "" {
		t.Errorf("the first caller of an upgraded name: %+v, want served unbound without a credential", d)
	}
	if rec, _ := r.Get("gpu-a"); rec.State != StateUnbound || rec.CredentialSHA256 != "" {
		t.Errorf("the first caller bound the upgraded name: %+v", rec)
	}
	if _, err := r.Approve("gpu-a"); err != nil {
		t.Fatal(err)
	}
	if d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true, Address: "10.0.0.1"}); d.Outcome != Accept || d.Credential == "" {
		t.Errorf("after an admin approved the bind: %+v, want a credential", d)
	}
	if rec, _ := r.Get("gpu-a"); rec.State != StateEnrolled || rec.BindApproved {
		t.Errorf("after the bind: %+v", rec)
	}

	// An old agent enrols a name unbound from 10.0.0.7; it binds from there only.
	if d := r.Admit(Hello{Node: "gpu-b", Address: "10.0.0.7"}); d.Outcome != Accept || d.Credential != "" {
		t.Fatalf("an old agent's new name: %+v", d)
	}
	if d := r.Admit(Hello{Node: "gpu-b", KeepsCredential: true, Address: "10.0.0.66"}); d.Credential != "" {
		t.Errorf("bound from another address than it enrolled from: %+v", d)
	}
	if d := r.Admit(Hello{Node: "gpu-b", KeepsCredential: true, Address: "10.0.0.7"}); d.Outcome != Accept || d.Credential == "" {
		t.Errorf("from the address it enrolled from: %+v, want a credential", d)
	}
}

// New names are rate-limited per agent token and per source address; a
// reconnect storm of known names is not. Twenty-five hosts starting at
// once all enrol.
func TestNewNamesAreRateLimited(t *testing.T) {
	r, _, clk := newRegistry(t, DefaultConfig())
	for i := range 25 {
		h := Hello{Node: fmt.Sprintf("host-%02d", i), KeepsCredential: true, Address: fmt.Sprintf("10.0.1.%d", i), Token: "t1"}
		if d := r.Admit(h); d.Outcome != Accept {
			t.Fatalf("host %d of 25 starting at once: %+v", i, d)
		}
	}
	accepted := 0
	for i := range 100 {
		if d := r.Admit(Hello{Node: fmt.Sprintf("fake-%03d", i), KeepsCredential: true, Address: "10.6.6.6", Token: "t1"}); d.Outcome == Accept {
			accepted++
		} else if d.Label != LabelRate {
			t.Fatalf("refused for another reason: %+v", d)
		}
	}
	t.Logf("100 new names from one address in a minute: %d enrolled (new_nodes_per_minute_per_address %d)", accepted, DefaultNewPerAddress)
	if accepted != DefaultNewPerAddress {
		t.Errorf("%d of 100 new names from one address enrolled, want %d", accepted, DefaultNewPerAddress)
	}
	spread := 0
	for i := range 400 {
		if d := r.Admit(Hello{Node: fmt.Sprintf("spread-%03d", i), KeepsCredential: true, Address: fmt.Sprintf("10.7.%d.%d", i/200, i%200), Token: "t1"}); d.Outcome == Accept {
			spread++
		}
	}
	t.Logf("400 new names from 400 addresses with one token in the same minute: %d enrolled (new_nodes_per_minute_per_token %d)", spread, DefaultNewPerToken)
	if 25+accepted+spread != DefaultNewPerToken {
		t.Errorf("one token enrolled %d names in a minute, want %d", 25+accepted+spread, DefaultNewPerToken)
	}
	// The 25 hosts reconnect, ten times each, within the same minute.
	for range 10 {
		for i := range 25 {
			if d := r.Admit(Hello{Node: fmt.Sprintf("host-%02d", i), Address: fmt.Sprintf("10.0.1.%d", i), Token: "t1"}); d.Label == LabelRate {
				t.Fatalf("a known name reconnecting was rate-limited: %+v", d)
			}
		}
	}
	clk.t = clk.t.Add(time.Minute)
	if d := r.Admit(Hello{Node: "next-minute", KeepsCredential: true, Address: "10.6.6.6", Token: "t1"}); d.Outcome != Accept {
		t.Errorf("a new name in the next minute: %+v", d)
	}
}

// Admitted is true only for a name that may hold a connection: enrolled
// or unbound, not pending, rejected, released or unknown.
func TestAdmitted(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ApproveNew = true
	r, _, _ := newRegistry(t, cfg)
	if r.Admitted("gpu-a") {
		t.Error("an unknown name is admitted")
	}
	if d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true}); d.Outcome != Pending {
		t.Fatalf("with approval on: %+v", d)
	}
	if r.Admitted("gpu-a") {
		t.Error("a pending name is admitted")
	}
	if _, err := r.Approve("gpu-a"); err != nil || !r.Admitted("gpu-a") {
		t.Errorf("approved: admitted %v, %v", r.Admitted("gpu-a"), err)
	}
	if d := r.Admit(Hello{Node: "old", KeepsCredential: false}); d.Outcome != Pending {
		t.Fatalf("an old agent with approval on: %+v", d)
	}
	if _, err := r.Approve("old"); err != nil || !r.Admitted("old") {
		t.Errorf("an approved unbound name: admitted %v, %v", r.Admitted("old"), err)
	}
	if _, err := r.Reject("gpu-a"); err != nil || r.Admitted("gpu-a") {
		t.Errorf("rejected: admitted %v, %v", r.Admitted("gpu-a"), err)
	}
	if err := r.Release("old"); err != nil || r.Admitted("old") {
		t.Errorf("released: admitted %v, %v", r.Admitted("old"), err)
	}
}

// A name outside grammar.NodeName is refused at Admit, saying the rule and
// what to set, and nothing is stored. A record stored under such a name
// before the rule is loaded as it is: listed and releasable, admitting no
// connection, and forgotten once unseen for ForgetAfter.
func TestNodeNameGrammar(t *testing.T) {
	r, st, clk := newRegistry(t, DefaultConfig())
	for _, name := range []string{"gpu a", "gpu/a", "-gpu", ".", "gpu\u202egnp"} {
		d := r.Admit(Hello{Node: name, KeepsCredential: true})
		if d.Outcome != Refuse || d.Label != LabelName || len(d.Close) > 123 ||
			!strings.Contains(d.Reason, "node name") || !strings.Contains(d.Reason, "[node] name") || !strings.Contains(d.Close, "grammar") {
			t.Errorf("Admit(%q) = %+v, want a refusal naming the rule and what to set", name, d)
		}
	}
	if len(st.recs) != 0 || len(r.List()) != 0 {
		t.Fatalf("refused names were stored: %v", st.recs)
	}

	seen := clk.t
	st.recs["gpu a"] = Record{Name: "gpu a", State: StateEnrolled, CredentialSHA256: hash("c"), Since: seen, LastSeen: seen}
	st.recs["gpu b"] = Record{Name: "gpu b", State: StateUnbound, Since: seen, LastSeen: seen}
	st.recs["gpu-c"] = Record{Name: "gpu-c", State: StateUnbound, Since: seen, LastSeen: seen}
	again, err := New(DefaultConfig(), st, st.recs, clk.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.List(); len(got) != 3 || got[0].Name != "gpu a" || got[0].State != StateEnrolled || got[1].State != StateUnbound {
		t.Fatalf("loaded %+v, want the three records as stored", got)
	}
	if d := again.Admit(Hello{Node: "gpu a", Credential: "c", KeepsCredential: true}); d.Outcome != Refuse || d.Label != LabelName {
		t.Errorf("a connection under a stored name outside the grammar: %+v", d)
	}
	if err := again.Release("gpu b"); err != nil {
		t.Errorf("release: %v", err)
	}
	if _, ok := st.recs["gpu b"]; ok {
		t.Error("the released record is still stored")
	}
	clk.t = clk.t.Add(DefaultConfig().ForgetAfter)
	again.Tick(func(string) bool { return false }, nil)
	if _, ok := st.recs["gpu a"]; ok {
		t.Error("a stored name outside the grammar was not forgotten after forget_nodes_after")
	}
}
