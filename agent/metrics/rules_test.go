package metrics

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"heft/shared/testutil"
	"heft/shared/wire"
)

// The example alert rules (packaging/prometheus/heft-rules.yml) fire on
// what the agent really exports: promtool evaluates them over a scrape
// replayed every minute for 20 minutes. A GPU held at 61 % of its maximum
// clock under load is HeftGPUClockLow, an idle GPU at 345 MHz is not, and
// an agent away from its coordinator is HeftAgentDisconnected.
func TestAlertRulesOnAScrape(t *testing.T) {
	s := fixedState()
	s.Connected = false
	s.GPUs[0].SMClockMHz = 1200 // 61 % of 1980, 97 % busy
	s.GPUs[1] = wire.GPU{Index: 1, UUID: "GPU-idle", MemoryTotal: 80 * gib, MemoryFree: 80 * gib,
		SMClockMHz: 345, SMClockMaxMHz: 1980, ClockEventReasons: []string{"gpu_idle"}}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(scrape(t, s)))
	if err != nil {
		t.Fatal(err)
	}
	testutil.AlertsOnAScrape(t, filepath.Join(testutil.RepoRoot(t), "packaging/prometheus/heft-rules.yml"), "heft-agent", mfs, 20, "15m", []string{
		`alertname="HeftAgentDisconnected", job="heft-agent", node="gpu-a", severity="warning"`,
		fmt.Sprintf(`alertname="HeftGPUClockLow", gpu="0", job="heft-agent", node="gpu-a", severity="warning", uuid=%q`, s.GPUs[0].UUID),
	})
}
