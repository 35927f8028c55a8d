package link

import (
	"errors"
	"sync"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// tokenSource is a token file as the link reads it: what it holds now.
type tokenSource struct {
	mu    sync.Mutex
	tok   string
	err   error
	reads int
}

func (s *tokenSource) set(tok string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tok, s.err = tok, err
}

func (s *tokenSource) read() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	return s.tok, s.err
}

// A token refused with 401 is read again from the file: once the file
// holds the token the coordinator takes, the agent connects with it.
func TestRefusedTokenIsReadAgain(t *testing.T) {
	f := newFakeCoord(t)
	src := &tokenSource{tok: "old-token"}
	cfg := testConfig(f)
	cfg.Token, cfg.ReadToken = "old-token", src.read
	r := start(t, cfg, newFakeHandler())
	r.log.waitLog(t, "coordinator rejected the agent token")
	src.set(testToken, nil) // the operator rolled the new token out
	fc := f.accept(t)
	if m := fc.next(t); m.Type != wire.TypeHello {
		t.Fatalf("got %q, want hello with the new token", m.Type)
	}
	r.log.waitLog(t, "read a new agent token from token_file")
}

// A reload signal reads the token again, for the next dial; a file that
// cannot be read keeps the token in use.
func TestReloadRereadsToken(t *testing.T) {
	f := newFakeCoord(t)
	src := &tokenSource{tok: testToken}
	reread := make(chan struct{})
	cfg := testConfig(f)
	cfg.ReadToken, cfg.Reread = src.read, reread
	r := start(t, cfg, newFakeHandler())
	fc := f.accept(t)
	fc.next(t)

	src.set("", errors.New("token file: mode 0644"))
	reread <- struct{}{}
	r.log.waitLog(t, "cannot read the agent token again; keeping the one in use")
	fc.c.CloseNow() // the session ends; the kept token still works
	cur := f.accept(t)
	if m := cur.next(t); m.Type != wire.TypeHello {
		t.Fatalf("got %q, want hello with the kept token", m.Type)
	}

	src.set("rotated-token", nil)
	reread <- struct{}{}
	r.log.waitLog(t, "read a new agent token from token_file")
	cur.c.CloseNow()
	testutil.Eventually(t, "a dial with the new token", 15*time.Second, func() bool { return f.dialedWith("Authorization", "Bearer rotated-token") })
}

// Once enrolled, the agent presents its node credential with its node
// name when it dials, besides the agent token.
func TestEnrolledDialPresentsCredential(t *testing.T) {
	f := newFakeCoord(t)
	cfg := testConfig(f)
	r := start(t, cfg, newFakeHandler())
	fc := f.accept(t)
	fc.next(t)
	if !f.dialedWith(wire.HeaderNodeCredential, "") {
		t.Fatal("the first dial, before enrolment, sent a credential header")
	}
	const cred = "a-credential-from-the-coordinator-0123456789"
	fc.send(t, &wire.Welcome{CoordinatorVersion: "test", NodeCredential: cred})
	r.log.waitLog(t, "enrolled")
	fc.c.CloseNow()
	f.accept(t).next(t)
	if !f.dialedWith(wire.HeaderNodeCredential, cred) || !f.dialedWith(wire.HeaderNode, "gpu-a") {
		t.Error("the dial after enrolment did not present the node name and credential")
	}
}

// dialedWith reports whether a dial carried header key with value ("" for
// a dial without it).
func (f *fakeCoord) dialedWith(key, value string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.headers {
		if h.Get(key) == value {
			return true
		}
	}
	return false
}
