package haproxy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/gateway/gwtest"
	"heft/gateway/haproxy"
	"heft/shared/testutil"
	"heft/shared/view"
)

// docsHAProxy reads the HAProxy example of docs/gateways.md's "HAProxy
// with heft-sync" section, so that the test runs what the docs tell
// operators to run: its socket, state file and frontend moved into the
// test's folder and port, and its slots cut to one, so that a second
// worker is added ("add server").
func docsHAProxy(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(data), "\n## HAProxy with heft-sync")
	_, block, ok := strings.Cut(section, "```haproxy\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/gateways.md: no haproxy block in the \"HAProxy with heft-sync\" section")
	}
	state := filepath.Join(t.TempDir(), "server-state")
	moved := map[string]string{
		"stats socket ":                 "    stats socket {{socket}} level admin expose-fd listeners",
		"server-state-file ":            "    server-state-file " + state,
		"bind ":                         "    bind {{front}}",
		"server-template heft 1-8 ":     "    server-template heft 1-1 127.0.0.1:9 disabled",
		"option httpchk GET /health":    "", // kept as it is, but must be there
		"default-server check inter 2s": "",
	}
	var lines []string
	for l := range strings.Lines(block) {
		for prefix, with := range moved {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				if with != "" {
					l = with + "\n"
				}
				delete(moved, prefix)
			}
		}
		lines = append(lines, l)
	}
	if len(moved) > 0 {
		t.Fatalf("docs/gateways.md's HAProxy example changed shape: no line starts with %q", keysOf(moved))
	}
	return strings.Join(lines, "")
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// An engine that serves fine while its /health answers late (3 s: an
// API server saturated by requests answers it on the same event loop)
// stays in docs/gateways.md's example backend, in a slot and as a server
// heft-sync added, and every request through it is answered: the
// backend's "timeout check" gives the answer 5 s after the connect.
// Without that line HAProxy gives the whole check "inter" (2 s): both
// engines are marked DOWN at their first check ("Layer7 timeout"), and
// every request gets a 503 though each engine answers it at once.
func TestSlowHealthRouteKeepsEnginesUp(t *testing.T) {
	docs := docsHAProxy(t)
	var without []string
	for l := range strings.Lines(docs) {
		if !strings.HasPrefix(strings.TrimSpace(l), "timeout check ") {
			without = append(without, l)
		}
	}
	for _, tc := range []struct {
		name, cfg string
	}{
		{"docs example", docs},
		{"without timeout check", strings.Join(without, "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := gwtest.NewSlowHealthUpstream(t, "a", 3*time.Second)
			b := gwtest.NewSlowHealthUpstream(t, "b", 3*time.Second)
			hx := gwtest.StartHAProxy(t, tc.cfg)
			h := newTarget(t, haproxy.Config{Socket: hx.Socket, Backend: "qwen", AddServers: true})
			apply(t, h, desired(gwtest.Worker(model, a.Addr, view.StateAdmitted, 1), gwtest.Worker(model, b.Addr, view.StateAdmitted, 1)))
			ra, rb := hx.ServerStat(t, "qwen", a.Addr), hx.ServerStat(t, "qwen", b.Addr)
			if names := ra["svname"] + " " + rb["svname"]; names != "heft1 heft-"+strings.ReplaceAll(b.Addr, ":", "-") &&
				names != "heft-"+strings.ReplaceAll(a.Addr, ":", "-")+" heft1" {
				t.Fatalf("servers %q: want one engine in slot heft1 and the other added", names)
			}
			front := "http://" + hx.Front + "/"
			if tc.name == "docs example" {
				hx.WaitSlowChecksPass(t, "qwen", a, 2)
				hx.WaitSlowChecksPass(t, "qwen", b, 2)
				for _, u := range []*gwtest.Upstream{a, b} {
					row := hx.ServerStat(t, "qwen", u.Addr)
					t.Logf("%s (%s): %s, last check %s in %s ms, %d answered late", u.Name, row["svname"], row["status"], row["check_status"], row["check_duration"], u.HealthChecks())
				}
				if split := gwtest.Split(t, front, 20); split["a"]+split["b"] != 20 || split["a"] == 0 || split["b"] == 0 {
					t.Fatalf("requests through the backend: %v, want all 20 answered by a and b", split)
				}
				return
			}
			testutil.Eventually(t, "both engines DOWN at a check timeout", 30*time.Second, func() bool {
				for _, u := range []*gwtest.Upstream{a, b} {
					row := hx.ServerStat(t, "qwen", u.Addr)
					if !strings.HasPrefix(row["status"], "DOWN") || row["check_status"] != "L7TOUT" {
						return false
					}
				}
				return true
			})
			if direct := gwtest.Split(t, "http://"+a.Addr+"/", 3); direct["a"] != 3 {
				t.Fatalf("the engine itself: %v, want it to answer", direct)
			}
			if split := gwtest.Split(t, front, 5); split["status 503"] != 5 {
				t.Fatalf("requests through the backend with both engines DOWN: %v, want 5 × 503", split)
			}
			t.Logf("without timeout check, engines that answer at once are DOWN; haproxy's log:\n%s", hx.Log())
		})
	}
}
