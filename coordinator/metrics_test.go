package coordinator

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/version"
	"heft/shared/wire"
)

// The coordinator's own lines on /metrics (heft_*) for a fixed fleet,
// byte for byte: two admitted workers (one pinned), one held for uneven
// pools, one measuring, one pending and one offline on another model.
// Run go test with -update after an intended change and review the diff.
func TestMetricsGolden(t *testing.T) {
	clk := newClock()
	c, err := New(testConfig(t), WithLogger(testLogger(t)), WithClock(clk.now))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := c.Fleet()
	answer := func(node string, acts []fleet.Action, tps map[string]float64) {
		t.Helper()
		for _, a := range acts {
			req, ok := a.Message.(*wire.ProbeRequest)
			if !ok || tps[req.CapacityKey] == 0 {
				continue
			}
			m := measured(req.CapacityKey, node, tps[req.CapacityKey], clk.now())
			m.Model = "" // the worker's
			if _, err := f.ProbeResult(node, wire.ProbeResult{RequestID: req.RequestID, Measurement: m}); err != nil {
				t.Fatal(err)
			}
		}
	}

	uneven := engine("gpu-a|uneven", 8002)
	uneven.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	f.Connect("gpu-a", 1, wire.Hello{Node: "gpu-a"})
	answer("gpu-a", f.Snapshot("gpu-a", snapshot("gpu-a", clk.now(), engine("gpu-a|fast", 8000), engine("gpu-a|slow", 8001), uneven)),
		map[string]float64{"gpu-a|fast": 1200, "gpu-a|slow": 600, "gpu-a|uneven": 1000})
	if err := f.Pin("gpu-a|slow", 0.75); err != nil {
		t.Fatal(err)
	}

	down := engine("gpu-b|down", 8000)
	down.Ready, down.Error = false, "connection refused"
	f.Connect("gpu-b", 2, wire.Hello{Node: "gpu-b"})
	f.Snapshot("gpu-b", snapshot("gpu-b", clk.now(), engine("gpu-b|new", 8001), down))

	other := engine("gpu-c|llama", 8000)
	other.Model = "meta-llama/Llama-3.1-8B"
	f.Connect("gpu-c", 3, wire.Hello{Node: "gpu-c"})
	answer("gpu-c", f.Snapshot("gpu-c", snapshot("gpu-c", clk.now(), other)), map[string]float64{"gpu-c|llama": 800})
	f.Disconnect("gpu-c", 3)
	clk.add(time.Minute) // past the offline grace
	f.Tick()

	rec := httptest.NewRecorder()
	c.Server().Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	testutil.Golden(t, filepath.Join("testdata", "golden", "metrics.txt"), heftLines(rec.Body.Bytes()))
}

// heftLines keeps the lines of a text exposition that belong to heft's
// own families (the Go and process collectors' values change from run to
// run), with the build's version written as "(version)".
func heftLines(exposition []byte) []byte {
	exposition = bytes.ReplaceAll(exposition, []byte(`version="`+version.Version+`"`), []byte(`version="(version)"`))
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	for sc.Scan() {
		line := sc.Text()
		name := strings.TrimPrefix(strings.TrimPrefix(line, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, "heft_") {
			out.WriteString(line + "\n")
		}
	}
	return out.Bytes()
}
