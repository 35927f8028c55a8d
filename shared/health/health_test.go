package health

import (
	"slices"
	"strings"
	"testing"

	"heft/shared/wire"
)

func TestPools(t *testing.T) {
	th := DefaultThresholds()
	tests := []struct {
		name     string
		ranks    []wire.Rank
		severity string // "" = no finding
	}{
		{"one rank", []wire.Rank{{DPRank: 0, KVTokens: 24094}}, ""},
		{"even", []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 24037}}, ""},
		{"the L4 story", []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}, wire.SeverityCritical},
		{"mildly uneven", []wire.Rank{{DPRank: 0, KVTokens: 1000}, {DPRank: 1, KVTokens: 700}}, wire.SeverityWarning},
		{"just under hold", []wire.Rank{{DPRank: 0, KVTokens: 1000}, {DPRank: 1, KVTokens: 499}}, wire.SeverityCritical},
		{"at hold", []wire.Rank{{DPRank: 0, KVTokens: 1000}, {DPRank: 1, KVTokens: 500}}, wire.SeverityWarning},
		{"at warn", []wire.Rank{{DPRank: 0, KVTokens: 1000}, {DPRank: 1, KVTokens: 900}}, ""},
		{"empty pools", []wire.Rank{{DPRank: 0, KVTokens: 0}, {DPRank: 1, KVTokens: 0}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Pools(tt.ranks, th)
			if tt.severity == "" {
				if f != nil {
					t.Fatalf("unexpected finding %+v", f)
				}
				return
			}
			if f == nil || f.Severity != tt.severity || f.Code != wire.CodeDPPoolImbalance {
				t.Fatalf("finding = %+v, want %s %s", f, wire.CodeDPPoolImbalance, tt.severity)
			}
		})
	}
	f := Pools([]wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}, th)
	for _, want := range []string{"rank 0 holds 24,094", "rank 1 only 2,925", "12%", "second request", "held", "whole, empty GPUs", "separate servers"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message lacks %q:\n%s", want, f.Message)
		}
	}
}

func TestPoolRatio(t *testing.T) {
	r, small, large, ok := PoolRatio([]wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}, {DPRank: 2, KVTokens: 24000}})
	if !ok || small.DPRank != 1 || large.DPRank != 0 {
		t.Fatalf("ratio %v small %v large %v ok %v", r, small, large, ok)
	}
	if got := float64(int(r*10000)) / 10000; got != 0.1213 {
		t.Errorf("ratio = %v", r)
	}
}

func TestForeignProcesses(t *testing.T) {
	th := DefaultThresholds()
	gpus := []wire.GPU{
		{Index: 0, UUID: "GPU-0", Processes: []wire.GPUProcess{{PID: 10, Name: "python3", UsedMemory: 20 << 30}}},
		{Index: 1, UUID: "GPU-1", Processes: []wire.GPUProcess{{PID: 10, UsedMemory: 15 << 30}, {PID: 99, Name: "train.py", UsedMemory: 3 << 30, Foreign: true}, {PID: 98, UsedMemory: 1 << 20, Foreign: true}}},
		{Index: 2, UUID: "GPU-2", Processes: []wire.GPUProcess{{PID: 77, Name: "other", UsedMemory: 8 << 30, Foreign: true}}},
	}
	e := wire.Engine{GPUUUIDs: []string{"GPU-0", "GPU-1"}}
	f := ForeignProcesses(e, gpus, th)
	if f == nil {
		t.Fatal("no finding")
	}
	if !strings.Contains(f.Message, "pid 99 (train.py) holds 3.00 GiB on GPU 1") {
		t.Errorf("message: %s", f.Message)
	}
	if strings.Contains(f.Message, "pid 98") || strings.Contains(f.Message, "pid 77") {
		t.Errorf("tiny or unrelated process reported: %s", f.Message)
	}
	if ForeignProcesses(wire.Engine{GPUUUIDs: []string{"GPU-0"}}, gpus, th) != nil {
		t.Error("finding on a clean GPU")
	}
}

func TestMeasurementFindings(t *testing.T) {
	th := DefaultThresholds()
	ok := wire.Measurement{ThroughputTPS: 900, OutputTokens: 2048, ExpectedTokens: 2048, Complete: true,
		SMClockMaxMHz: 2040, SMClockMedianMHz: 2000, SMClockMinMHz: 1900}
	if fs := Measurement(ok, th); len(fs) != 0 {
		t.Errorf("healthy measurement: %+v", fs)
	}
	low := ok
	low.SMClockMedianMHz, low.SMClockMinMHz, low.ClockEventReasons = 1200, 900, []string{"gpu_idle", "sw_thermal_slowdown"}
	fs := Measurement(low, th)
	codes := map[string]bool{}
	for _, f := range fs {
		codes[f.Code] = true
	}
	if !codes[wire.CodeGPUClockLow] || !codes[wire.CodeGPUThrottled] {
		t.Errorf("codes = %v", codes)
	}
	// A power cap alone (an H200 at 690 of 700 W beside a busy neighbour)
	// is a low clock, named as such, and no throttle.
	capped := ok
	capped.SMClockMaxMHz, capped.SMClockMedianMHz, capped.SMClockMinMHz, capped.ClockEventReasons = 1980, 1470, 1455, []string{"sw_power_cap"}
	fs = Measurement(capped, th)
	if len(fs) != 1 || fs[0].Code != wire.CodeGPUClockLow || !strings.Contains(fs[0].Message, "sw_power_cap") {
		t.Errorf("power cap: %+v", fs)
	}
	capped.ClockEventReasons = []string{"sw_power_cap", "hw_slowdown"}
	if fs = Measurement(capped, th); len(fs) != 2 || fs[1].Code != wire.CodeGPUThrottled || !strings.HasSuffix(fs[1].Message, ": hw_slowdown.") {
		t.Errorf("power cap and hw slowdown: %+v", fs)
	}
	short := ok
	short.Failure, short.OutputTokens = wire.CodeProbeIncompleteOutput, 1500
	fs = Measurement(short, th)
	if len(fs) != 1 || fs[0].Severity != wire.SeverityCritical || !strings.Contains(fs[0].Message, "1500 of 2048") {
		t.Errorf("short: %+v", fs)
	}
	mac := ok
	mac.Complete, mac.OutputTokens = false, 1800
	fs = Measurement(mac, th)
	if len(fs) != 1 || fs[0].Severity != wire.SeverityWarning || fs[0].Code != wire.CodeProbeIncompleteOutput {
		t.Errorf("mac: %+v", fs)
	}
	failed := wire.Measurement{Failure: wire.CodeProbeFailed, Problems: []string{"3 of 16 requests failed: HTTP 500"}}
	fs = Measurement(failed, th)
	if len(fs) != 1 || fs[0].Code != wire.CodeProbeFailed || !strings.Contains(fs[0].Message, "HTTP 500") {
		t.Errorf("failed: %+v", fs)
	}
}

func TestEngineAndSort(t *testing.T) {
	e := wire.Engine{URL: "http://x", Error: "connection refused", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 100}, {DPRank: 1, KVTokens: 80}}}
	fs := Engine(e, nil, DefaultThresholds())
	fs = append(fs, Finding{Code: "zzz", Severity: wire.SeverityInfo})
	Sort(fs)
	if fs[0].Code != wire.CodeEngineUnreachable || fs[1].Code != wire.CodeDPPoolImbalance || fs[2].Code != "zzz" {
		t.Errorf("order: %+v", fs)
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 24094: "24,094", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := Thousands(in); got != want {
			t.Errorf("Thousands(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestMeasurementMessageStaysShort(t *testing.T) {
	m := wire.Measurement{Failure: wire.CodeProbeFailed}
	for i := 0; i < 64; i++ {
		m.Problems = append(m.Problems, strings.Repeat("x", 4096))
	}
	fs := Measurement(m, DefaultThresholds())
	if len(fs) != 1 || len(fs[0].Message) > 1200 || !strings.Contains(fs[0].Message, "and 61 more") {
		t.Errorf("message of %d bytes: %.200s", len(fs[0].Message), fs[0].Message)
	}
}

func TestRoutable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		e        wire.Engine
		want     string // part of the message, "" for no finding
		severity string
	}{
		{"derived from every interface", wire.Engine{URL: "http://127.0.0.1:8000", AdvertiseURL: "http://10.0.0.5:8000",
			AdvertiseSource: wire.AdvertiseNodeAddress, Listen: []string{"0.0.0.0:8000"}}, "", ""},
		{"routable URL, older agent", wire.Engine{URL: "http://10.0.0.5:8000"}, "", ""},
		{"configured loopback", wire.Engine{URL: "http://127.0.0.1:8000", AdvertiseURL: "http://localhost:8000",
			AdvertiseSource: wire.AdvertiseConfig}, "advertised to gateways at http://localhost:8000, a loopback address", wire.SeverityInfo},
		{"listens on loopback only", wire.Engine{URL: "http://127.0.0.1:8000", Listen: []string{"127.0.0.1:8000", "[::1]:8000"}},
			"listens on 127.0.0.1:8000, [::1]:8000 only", ""},
		{"sockets unseen", wire.Engine{URL: "http://localhost:8000"}, "could not see where the engine listens", ""},
		{"unspecified URL host", wire.Engine{URL: "http://0.0.0.0:8000"}, "could not see", ""},
	} {
		if tc.severity == "" {
			tc.severity = wire.SeverityWarning
		}
		f := Routable(tc.e)
		switch {
		case tc.want == "" && f != nil:
			t.Errorf("%s: %+v, want none", tc.name, f)
		case tc.want != "" && (f == nil || f.Code != wire.CodeNotRoutable || f.Severity != tc.severity || !strings.Contains(f.Message, tc.want)):
			t.Errorf("%s: %+v, want a not_routable %s saying %q", tc.name, f, tc.severity, tc.want)
		case f != nil && !strings.Contains(f.Message, "advertise_url"):
			t.Errorf("%s: %q names no fix", tc.name, f.Message)
		}
	}
	if fs := Engine(wire.Engine{URL: "http://127.0.0.1:8000", Listen: []string{"127.0.0.1:8000"}}, nil, DefaultThresholds()); len(fs) != 1 || fs[0].Code != wire.CodeNotRoutable {
		t.Errorf("Engine: %+v", fs)
	}
}

func TestContextExceedsPool(t *testing.T) {
	e := wire.Engine{MaxModelLen: 40960, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}}
	f := ContextExceedsPool(e)
	if f == nil || f.Code != wire.CodeContextExceedsPool || f.Severity != wire.SeverityWarning {
		t.Fatalf("finding %+v", f)
	}
	for _, want := range []string{"40,960 tokens (max model length)", "rank 1", "only 2,925 tokens", "(max_context_tokens) is 2,925"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message lacks %q: %s", want, f.Message)
		}
	}
	for name, e := range map[string]wire.Engine{
		"pool holds it":      {MaxModelLen: 32768, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 200000}}},
		"equal":              {MaxModelLen: 8192, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 8192}}},
		"no model length":    {Ranks: []wire.Rank{{DPRank: 0, KVTokens: 2925}}},
		"no pools":           {MaxModelLen: 40960},
		"pool of 0 (unread)": {MaxModelLen: 40960, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 0}}},
	} {
		if f := ContextExceedsPool(e); f != nil {
			t.Errorf("%s: %+v", name, f)
		}
	}
	one := ContextExceedsPool(wire.Engine{MaxModelLen: 40960, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 6000}}})
	if one == nil || !strings.Contains(one.Message, "its KV pool holds only 6,000") || strings.Contains(one.Message, "rank 0") {
		t.Errorf("one rank: %+v", one)
	}
	if fs := Engine(e, nil, DefaultThresholds()); !slices.ContainsFunc(fs, func(x Finding) bool { return x.Code == wire.CodeContextExceedsPool }) {
		t.Errorf("Engine findings lack it: %+v", fs)
	}
}

func TestPrefillFinding(t *testing.T) {
	m := wire.Measurement{ThroughputTPS: 900, OutputTokens: 2048, ExpectedTokens: 2048, Complete: true,
		Prefill: &wire.Prefill{Failure: wire.PrefillCached, Problems: []string{"the first token came back in 0.014 s"}}}
	fs := Measurement(m, DefaultThresholds())
	if len(fs) != 1 || fs[0].Code != wire.CodePrefillFailed || fs[0].Severity != wire.SeverityWarning ||
		!strings.Contains(fs[0].Message, "as if read from a cache") || !strings.Contains(fs[0].Message, "0.014 s") {
		t.Fatalf("findings %+v", fs)
	}
	m.Prefill.Failure = ""
	if fs := Measurement(m, DefaultThresholds()); len(fs) != 0 {
		t.Errorf("a good prefill part: %+v", fs)
	}
	// A failed decode part says it all; no second warning.
	m.Failure, m.Prefill.Failure = wire.CodeProbeFailed, wire.PrefillRejected
	if f := Prefill(m); f != nil {
		t.Errorf("prefill warning under a failed decode part: %+v", f)
	}
}
