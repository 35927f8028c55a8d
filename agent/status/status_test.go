package status

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
)

// testBoard is a Board on a clock the test moves, and its log.
func testBoard(t *testing.T) (*Board, *testutil.SyncBuffer, *time.Time) {
	t.Helper()
	clock := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	b := New()
	b.now = func() time.Time { return clock }
	return b, &testutil.SyncBuffer{}, &clock
}

func logger(out *testutil.SyncBuffer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "heft-agent.collect", Output: out, DisableTime: true})
}

func lines(out *testutil.SyncBuffer) []string {
	s := strings.TrimSpace(out.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// One line when a thing starts failing, none while the same reason
// repeats (however its detail varies), one when the reason changes, and
// an info line when it recovers; never one per report.
func TestOneLinePerChange(t *testing.T) {
	b, out, clock := testBoard(t)
	r := b.Reporter(AreaEngine, "url", logger(out))
	url := "http://127.0.0.1:8000"

	r.OK(url, "engine reachable again")
	if got := lines(out); got != nil {
		t.Fatalf("a thing that never failed logged %q", got)
	}
	for i := range 50 {
		r.Fail(url, Failure{Reason: "unreachable", Msg: "engine unreachable", Err: "connection refused, poll " + string(rune('a'+i%26))})
	}
	*clock = clock.Add(90 * time.Second)
	r.Fail(url, Failure{Reason: "not json", Msg: "engine answers something else", Err: "GET /v1/models answered HTML"})
	r.Fail(url, Failure{Reason: "not json", Msg: "engine answers something else", Err: "GET /v1/models answered HTML"})
	*clock = clock.Add(30 * time.Second)
	if !r.OK(url, "engine reachable again") {
		t.Error("OK after a failure reported no recovery")
	}
	r.OK(url, "engine reachable again")

	want := []string{
		`[WARN]  heft-agent.collect: engine unreachable: url=http://127.0.0.1:8000 reason=unreachable error="connection refused, poll a"`,
		`[WARN]  heft-agent.collect: engine answers something else: url=http://127.0.0.1:8000 reason="not json" error="GET /v1/models answered HTML"`,
		`[INFO]  heft-agent.collect: engine reachable again: url=http://127.0.0.1:8000 failed_for=2m0s`,
	}
	got := lines(out)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestErrorLevelAndArgs(t *testing.T) {
	b, out, _ := testBoard(t)
	r := b.Reporter(AreaCoordinator, "url", logger(out))
	r.Fail("ws://c:7070/api/v1/agent", Failure{Reason: "refused", Msg: "coordinator refused the agent token", Error: true,
		Err: "401", Args: []any{"hint", "check token_file"}})
	want := `[ERROR] heft-agent.collect: coordinator refused the agent token: url=ws://c:7070/api/v1/agent reason=refused hint="check token_file" error=401`
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// The Board answers what stands now, in a fixed order, with when each
// state began.
func TestItems(t *testing.T) {
	b, out, clock := testBoard(t)
	logs := b.Reporter(AreaLog, "log", logger(out))
	engines := b.Reporter(AreaEngine, "url", logger(out))
	start := *clock
	logs.Fail("/var/log/vllm.log", Failure{Reason: "missing", Msg: "engine log missing", Err: "no such file"})
	engines.OK("http://b:8000", "")
	engines.Fail("http://a:8000", Failure{Reason: "unreachable", Msg: "engine unreachable"})
	*clock = clock.Add(time.Minute)
	engines.Fail("http://a:8000", Failure{Reason: "unreachable", Msg: "engine unreachable", Err: "later detail"})

	got := b.Items()
	want := []Item{
		{Area: AreaEngine, Name: "http://a:8000", Reason: "unreachable", Error: "later detail", Since: start},
		{Area: AreaEngine, Name: "http://b:8000", OK: true, Since: start},
		{Area: AreaLog, Name: "/var/log/vllm.log", Reason: "missing", Error: "no such file", Since: start},
	}
	if len(got) != len(want) {
		t.Fatalf("items %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("item %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if it, ok := b.Get(AreaEngine, "http://b:8000"); !ok || !it.OK {
		t.Errorf("Get = %+v, %v", it, ok)
	}
	if _, ok := b.Get(AreaProbe, "nothing"); ok {
		t.Error("Get found a thing never reported")
	}
}
