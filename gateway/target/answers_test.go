package target

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Resolver with an answers file hands its names' answers to the next
// one: the last good address of a name that fails now, and the address a
// name that moved was at. IP literals are not kept; an unchanged memory
// is not written again.
func TestAnswersSurviveARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "answers.json")
	f := &fakeLookup{names: map[string]string{"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}}
	r := NewResolver(f.lookup)
	if n, err := r.KeepAnswers(path); n != 0 || err != nil {
		t.Fatalf("no file yet: %d %v", n, err)
	}
	bs := []Backend{{Address: "10.0.0.3:8000", WorkerID: "c"}, {Address: "gpu-a:8000", WorkerID: "a"}, {Address: "gpu-b:8000", WorkerID: "b"}}
	if _, _, err := r.ResolveAll(context.Background(), bs); err != nil {
		t.Fatal(err)
	}
	f.set("gpu-b", "10.0.0.9", false)
	if _, _, err := r.ResolveAll(context.Background(), bs); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if _, _, err := r.ResolveAll(context.Background(), bs); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(path); !st2.ModTime().Equal(st.ModTime()) {
		t.Error("an unchanged memory was written again")
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "10.0.0.3") {
		t.Errorf("an IP literal was kept:\n%s", data)
	}

	f.set("gpu-b", "10.0.0.9", true) // the outage; a new heft-sync
	next := NewResolver(f.lookup)
	if n, err := next.KeepAnswers(path); n != 2 || err != nil {
		t.Fatalf("read back %d, %v:\n%s", n, err, data)
	}
	rs, _, err := next.ResolveAll(context.Background(), bs)
	if Reason(err) != ReasonResolve || len(rs) != 3 {
		t.Fatalf("resolved %+v, %v", rs, err)
	}
	if rs[2].Addr != netip.MustParseAddrPort("10.0.0.9:8000") || rs[2].Prev != netip.MustParseAddrPort("10.0.0.2:8000") ||
		rs[1].Addr != netip.MustParseAddrPort("10.0.0.1:8000") {
		t.Fatalf("after the restart: %+v, want a at 10.0.0.1 and b at 10.0.0.9, moved from 10.0.0.2", rs)
	}
}

// An answers file is used whole or not at all: each entry a DNS name with
// an IP at its port that a gateway may be given.
func TestAnswersFileRejects(t *testing.T) {
	for name, text := range map[string]string{
		"not JSON":         "{",
		"an IP literal":    `{"answers":[{"address":"10.0.0.1:80","resolved":"10.0.0.1:80"}]}`,
		"another port":     `{"answers":[{"address":"gpu-a:80","resolved":"10.0.0.1:81"}]}`,
		"multicast":        `{"answers":[{"address":"gpu-a:80","resolved":"224.0.0.1:80"}]}`,
		"unspecified":      `{"answers":[{"address":"gpu-a:80","resolved":"0.0.0.0:80","before":"10.0.0.1:80"}]}`,
		"a bad before":     `{"answers":[{"address":"gpu-a:80","resolved":"10.0.0.1:80","before":"x"}]}`,
		"a hostile name":   `{"answers":[{"address":"gpu-a:80\nserver evil 1.2.3.4:80","resolved":"10.0.0.1:80"}]}`,
		"a mapped IPv4":    `{"answers":[{"address":"gpu-a:80","resolved":"[::ffff:10.0.0.1]:80"}]}`,
		"nothing resolved": `{"answers":[{"address":"gpu-a:80"}]}`,
	} {
		if _, err := decodeAnswers([]byte(text)); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
	if got, err := decodeAnswers([]byte(`{"answers":[{"address":"gpu-a:80","resolved":"10.0.0.1:80","before":"[fd00::1]:80","later":1}],"v":2}`)); err != nil ||
		got["gpu-a:80"].prev != netip.MustParseAddrPort("[fd00::1]:80") {
		t.Fatalf("a good file with fields a later heft-sync may add: %v %v", got, err)
	}
}

// The one kept of two workers at one IP:port carries its own old address,
// else the other's, whatever their order.
func TestResolveAllKeepsTheWinnersOldAddress(t *testing.T) {
	f := &fakeLookup{names: map[string]string{"gpu-w": "10.0.0.2", "gpu-l": "10.0.0.5"}}
	r := NewResolver(f.lookup)
	w := Backend{Address: "gpu-w:8000", WorkerID: "w-2", Serving: true, Weight: 1}
	l := Backend{Address: "gpu-l:8000", WorkerID: "w-1"}
	_, _, _ = r.ResolveAll(context.Background(), []Backend{w, l})
	f.set("gpu-w", "10.0.0.9", false)
	f.set("gpu-l", "10.0.0.9", false)
	for _, bs := range [][]Backend{{l, w}, {w, l}} {
		rs, _, _ := r.ResolveAll(context.Background(), bs)
		if len(rs) != 1 || rs[0].WorkerID != "w-2" || rs[0].Prev != netip.MustParseAddrPort("10.0.0.2:8000") {
			t.Fatalf("resolved %+v, want w with its old address 10.0.0.2", rs)
		}
	}
	// Only the other moved: its old address is the kept one's to leave.
	r = NewResolver(f.lookup)
	f.set("gpu-l", "10.0.0.5", false)
	_, _, _ = r.ResolveAll(context.Background(), []Backend{w, l})
	f.set("gpu-l", "10.0.0.9", false)
	for _, bs := range [][]Backend{{l, w}, {w, l}} {
		rs, _, _ := r.ResolveAll(context.Background(), bs)
		if len(rs) != 1 || rs[0].WorkerID != "w-2" || rs[0].Prev != netip.MustParseAddrPort("10.0.0.5:8000") {
			t.Fatalf("resolved %+v, want w with l's old address 10.0.0.5", rs)
		}
	}
}
