package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"heft/agent/config"
	"heft/agent/metrics"
	"heft/agent/probe"
	"heft/agent/status"
	"heft/shared/testutil"
	"heft/shared/wire"
)

// A failed probe is one warning with its failure code and first problem,
// the same failure again is not another, and a measurement after it is
// one info line; every probe is counted by outcome.
func TestProbeOutcomesLoggedOncePerChange(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	board := status.New()
	h := NewHandler(config.Default(), nil, nil, board, hclog.New(&hclog.LoggerOptions{Name: "heft-agent", Output: logs, DisableTime: true}))
	url := "http://127.0.0.1:8000"
	failed := wire.Measurement{Failure: wire.CodeProbeIncompleteOutput,
		Problems: []string{"the engine did not return exactly 128 tokens per request as asked", "request 3: 97 tokens"}}
	h.recordProbe(url, "k1", failed, nil)
	h.recordProbe(url, "k1", failed, nil)
	h.recordProbe(url, "k1", wire.Measurement{}, probe.ErrBusy)
	h.recordProbe(url, "k1", wire.Measurement{}, errors.New("no engine on this node has capacity key"))
	h.recordProbe(url, "k1", wire.Measurement{ThroughputTPS: 990, OutputTokens: 2048}, nil)

	want := fmt.Sprintf(`[WARN]  heft-agent.probe: probe failed: url=%s reason=probe_incomplete_output capacity_key=k1 error="the engine did not return exactly 128 tokens per request as asked"`, url)
	if n := strings.Count(logs.String(), want); n != 1 {
		t.Errorf("%d lines %q, want 1; log:\n%s", n, want, logs.String())
	}
	if n := strings.Count(logs.String(), "[INFO]  heft-agent.probe: probe measured the engine again: url="+url); n != 1 {
		t.Errorf("%d recovery lines; log:\n%s", n, logs.String())
	}
	got := h.probeCounts(url)
	wantCounts := map[string]int64{wire.CodeProbeIncompleteOutput: 2, metrics.OutcomeBusy: 1, metrics.OutcomeError: 1, metrics.OutcomeMeasured: 1}
	if fmt.Sprint(got) != fmt.Sprint(wantCounts) {
		t.Errorf("counts %v, want %v", got, wantCounts)
	}
	if it, _ := board.Get(status.AreaProbe, url); !it.OK {
		t.Errorf("board %+v", it)
	}
}
