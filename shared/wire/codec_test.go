package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func validSnapshot() *Snapshot {
	return &Snapshot{
		Node: "gpu-a",
		At:   time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		Host: Host{Hostname: "gpu-a", OS: "linux", Arch: "amd64", CPUCores: 16},
		GPUs: []GPU{{Index: 0, UUID: "GPU-1", Name: "NVIDIA L4", MemoryTotal: 24 << 30, SMClockMHz: 2040, SMClockMaxMHz: 2040}},
		Engines: []Engine{{Kind: EngineSGLang, URL: "http://127.0.0.1:30000", Model: "Qwen/Qwen3-8B", Ready: true,
			CapacityKey: "abc", Ranks: []Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}}},
	}
}

func validMeasurement() Measurement {
	return Measurement{CapacityKey: "abc", EngineKind: EngineVLLM, EngineURL: "http://127.0.0.1:8000", Model: "m",
		ThroughputTPS: 992, WarmupTPS: 453, OutputTokens: 2048, ExpectedTokens: 2048, Requests: 16, Concurrency: 16,
		TokensPerReq: 128, Complete: true}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := Encode(validSnapshot())
	tests := []struct {
		name    string
		data    string
		wantErr error
		says    string
	}{
		{"not json", `{"type":`, ErrInvalid, "not a JSON object"},
		{"array", `[1,2]`, ErrInvalid, "not a JSON object"},
		{"no version", `{"type":"hello","hello":{"node":"a"}}`, ErrInvalid, "missing protocol version"},
		{"newer peer", `{"type":"hello","v":2,"hello":{"brand":"new"}}`, ErrVersion, "v2"},
		{"older peer", `{"type":"hello","v":0}`, ErrVersion, "v0"},
		{"unknown type", `{"type":"gossip","v":1,"hello":{"node":"a","host":{}}}`, ErrInvalid, "unknown message type"},
		{"no payload", `{"type":"hello","v":1}`, ErrInvalid, "exactly one payload"},
		{"two payloads", `{"type":"hello","v":1,"hello":{"node":"a"},"welcome":{}}`, ErrInvalid, "exactly one payload"},
		{"wrong payload", `{"type":"hello","v":1,"welcome":{}}`, ErrInvalid, "lacks"},
		{"empty node", `{"type":"hello","v":1,"hello":{"node":" "}}`, ErrInvalid, "hello.node is empty"},
		{"negative throughput", `{"type":"probe_result","v":1,"probe_result":{"measurement":{"capacity_key":"k","throughput_tps":-5}}}`, ErrInvalid, "negative"},
		{"negative pool", strings.Replace(string(good), `"kv_tokens":2925`, `"kv_tokens":-1`, 1), ErrInvalid, "negative"},
		{"duplicate rank", strings.Replace(string(good), `"dp_rank":1`, `"dp_rank":0`, 1), ErrInvalid, "twice"},
		{"engine kind not a name", strings.Replace(string(good), `"kind":"sglang"`, `"kind":"TGI server"`, 1), ErrInvalid, "engine.kind"},
		{"empty engine kind", strings.Replace(string(good), `"kind":"sglang"`, `"kind":""`, 1), ErrInvalid, "engine.kind"},
		{"advertise url without scheme", strings.Replace(string(good), `"ready":true`, `"ready":true,"advertise_url":"10.0.0.5:30000"`, 1), ErrInvalid, "engine.advertise_url"},
		{"advertise url not http", strings.Replace(string(good), `"ready":true`, `"ready":true,"advertise_url":"ftp://10.0.0.5:30000"`, 1), ErrInvalid, "engine.advertise_url"},
		{"negative pace", strings.Replace(string(good), `"ready":true`, `"ready":true,"pace":{"at":"2026-12-01T12:00:00Z","window_seconds":10,"seconds_per_token":-0.01,"batch":4,"throughput_tps":100}`, 1), ErrInvalid, "engine.pace.seconds_per_token"},
		{"negative recent pace", strings.Replace(string(good), `"ready":true`, `"ready":true,"pace":{"at":"2026-12-01T12:00:00Z","window_seconds":10,"seconds_per_token":0.01,"batch":4,"throughput_tps":100,"recent":{"window_seconds":5,"seconds_per_token":0.01,"batch":-4}}`, 1), ErrInvalid, "engine.pace.recent.batch"},
		{"negative max running", strings.Replace(string(good), `"ready":true`, `"ready":true,"max_running":-1`, 1), ErrInvalid, "max_running"},
		{"absurd max running", strings.Replace(string(good), `"ready":true`, `"ready":true,"max_running":99999999`, 1), ErrInvalid, "max_running"},
		{"bad probe state", `{"type":"probe_status","v":1,"probe_status":{"capacity_key":"k","state":"sleeping"}}`, ErrInvalid, "unknown"},
		{"bad reason", `{"type":"probe_request","v":1,"probe_request":{"capacity_key":"k","reason":"whim"}}`, ErrInvalid, "unknown"},
		{"too big", `{"type":"hello","v":1,"hello":{"node":"` + strings.Repeat("a", MaxMessageBytes) + `"}}`, ErrInvalid, "exceeds"},
		{"nan literal", `{"type":"probe_result","v":1,"probe_result":{"measurement":{"capacity_key":"k","throughput_tps":NaN}}}`, ErrInvalid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.data))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.says != "" && !strings.Contains(err.Error(), tt.says) {
				t.Errorf("err %q does not say %q", err, tt.says)
			}
		})
	}
}

func TestEncodeRefusesNonFinite(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), -1} {
		m := validMeasurement()
		m.ThroughputTPS = v
		if _, err := Encode(&ProbeResult{Measurement: m}); !errors.Is(err, ErrInvalid) {
			t.Errorf("throughput %v: err = %v, want ErrInvalid", v, err)
		}
	}
	if _, err := Encode(struct{}{}); err == nil {
		t.Error("encoding an unknown payload type succeeded")
	}
}

func TestTooManyEngines(t *testing.T) {
	s := validSnapshot()
	for len(s.Engines) <= MaxEngines {
		s.Engines = append(s.Engines, s.Engines[0])
	}
	env := Envelope{Type: TypeSnapshot, Version: ProtocolVersion, Snapshot: s}
	data, _ := json.Marshal(env)
	if _, err := Decode(data); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "engines") {
		t.Errorf("err = %v", err)
	}
}

func TestMeasurementValid(t *testing.T) {
	m := validMeasurement()
	if !m.Valid() {
		t.Error("complete measurement not valid")
	}
	m.Complete = false // an engine that cannot force the length
	if !m.Valid() {
		t.Error("incomplete but unfailed measurement should stay usable")
	}
	m.Failure = "probe_incomplete_output"
	if m.Valid() {
		t.Error("failed measurement is valid")
	}
}

func FuzzDecode(f *testing.F) {
	for _, p := range []any{validSnapshot(), &ProbeResult{Measurement: validMeasurement()}, &ProbeRequest{RequestID: "r", CapacityKey: "k", Reason: ReasonOnDemand}} {
		data, _ := Encode(p)
		f.Add(data)
	}
	f.Add([]byte(`{"type":"hello","v":1,"hello":{"node":"a","host":{}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to a valid message.
		out, err := json.Marshal(env)
		if err != nil {
			t.Fatalf("re-marshal: %v", err)
		}
		if _, err := Decode(out); err != nil {
			t.Fatalf("decoded message does not decode again: %v", err)
		}
	})
}

// A pool set's completeness is checked against its ranks in the decoder,
// so the coordinator never reads "complete" for a set with a gap, nor
// "incomplete" for one that has every rank; an older agent that says
// nothing about it still decodes.
func TestPoolCompleteness(t *testing.T) {
	two := []Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	for _, tc := range []struct {
		name     string
		ranks    []Rank
		expected int
		complete *bool
		missing  []int
		says     string // "" when valid
	}{
		{"older agent", two, 0, nil, nil, ""},
		{"whole", two, 2, new(true), nil, ""},
		{"whole without a count", two, 0, new(true), nil, ""},
		{"one of four", two[:1], 4, new(false), []int{1, 2, 3}, ""},
		{"none yet", nil, 2, new(false), []int{0, 1}, ""},
		{"a gap", []Rank{{DPRank: 0, KVTokens: 1}, {DPRank: 2, KVTokens: 1}}, 3, new(false), []int{1}, ""},
		{"complete with a gap", two[:1], 2, new(true), nil, "complete is true"},
		{"complete and missing", two, 3, new(true), []int{2}, "complete is true"},
		{"complete without ranks", nil, 0, new(true), nil, "complete is true"},
		{"incomplete without a count", two, 0, new(false), nil, "complete is false"},
		{"incomplete but whole", two, 2, new(false), nil, "complete is false"},
		{"missing beyond the count", two, 2, new(false), []int{2}, "not a rank below"},
		{"missing that has a pool", two, 3, new(false), []int{1, 2}, "which has a pool"},
		{"missing twice", two, 4, new(false), []int{2, 2, 3}, "ascending"},
		{"missing out of order", two, 4, new(false), []int{3, 2}, "ascending"},
		{"negative count", two, -1, nil, nil, "expected_ranks"},
		{"count beyond the limit", two, MaxRanks + 1, nil, nil, "expected_ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSnapshot()
			e := &s.Engines[0]
			e.Ranks, e.ExpectedRanks, e.Complete, e.MissingRanks = tc.ranks, tc.expected, tc.complete, tc.missing
			data, _ := json.Marshal(Envelope{Type: TypeSnapshot, Version: ProtocolVersion, Snapshot: s})
			_, err := Decode(data)
			switch {
			case tc.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.says != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("err = %v, want one saying %q", err, tc.says)
			}
		})
	}
}

func TestPoolCheckAndLogSourceChecked(t *testing.T) {
	for name, change := range map[string]func(e *Engine){
		"pool check rank twice": func(e *Engine) {
			e.PoolCheck = &PoolCheck{Source: "metrics", Ranks: []Rank{{DPRank: 1, KVTokens: 1}, {DPRank: 1, KVTokens: 2}}}
		},
		"pool check negative": func(e *Engine) { e.PoolCheck = &PoolCheck{Source: "metrics", Ranks: []Rank{{DPRank: 0, KVTokens: -1}}} },
		"log source huge error": func(e *Engine) {
			e.LogSource = &LogSource{Spec: "docker:vllm", Error: strings.Repeat("x", MaxStringBytes+1)}
		},
		"log source negative lines":   func(e *Engine) { e.LogSource = &LogSource{Spec: "docker:vllm", Lines: -1} },
		"load negative stale seconds": func(e *Engine) { e.Load.StaleSeconds = -5 },
	} {
		t.Run(name, func(t *testing.T) {
			s := validSnapshot()
			change(&s.Engines[0])
			data, _ := json.Marshal(Envelope{Type: TypeSnapshot, Version: ProtocolVersion, Snapshot: s})
			if _, err := Decode(data); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestPrefillValidation(t *testing.T) {
	good := func() Measurement {
		m := validMeasurement()
		m.Prefill = &Prefill{ThroughputTPS: 9000, WarmupTPS: 8800, PromptTokens: 32768, ExpectedPromptTokens: 32768,
			WallSeconds: 3.6, PromptLength: 8192, Requests: 4, Concurrency: 4, TokenSource: "usage", Complete: true}
		return m
	}
	if m := good(); !m.PrefillValid() || m.Validate() != nil {
		t.Fatalf("a good prefill part: valid %v, validate %v", m.PrefillValid(), m.Validate())
	}
	for name, spoil := range map[string]func(*Prefill){
		"NaN throughput":        func(p *Prefill) { p.ThroughputTPS = math.NaN() },
		"negative wall":         func(p *Prefill) { p.WallSeconds = -1 },
		"negative tokens":       func(p *Prefill) { p.PromptTokens = -3 },
		"throughput, no tokens": func(p *Prefill) { p.PromptTokens = 0 },
		"long failure":          func(p *Prefill) { p.Failure = strings.Repeat("x", MaxStringBytes+1) },
		"too many problems":     func(p *Prefill) { p.Problems = make([]string, MaxProblemCount+1) },
	} {
		t.Run(name, func(t *testing.T) {
			m := good()
			spoil(m.Prefill)
			data, _ := json.Marshal(Envelope{Type: TypeProbeResult, Version: ProtocolVersion, ProbeResult: &ProbeResult{Measurement: m}})
			if _, err := Decode(data); !errors.Is(err, ErrInvalid) {
				t.Errorf("decode: err = %v, want ErrInvalid", err)
			}
		})
	}
	// A failed prefill part keeps the decode part valid, and gives no
	// prefill throughput to use.
	m := good()
	m.Prefill.Failure = PrefillCached
	if !m.Valid() || m.PrefillValid() {
		t.Errorf("failed prefill: decode valid %v (want true), prefill valid %v (want false)", m.Valid(), m.PrefillValid())
	}
	// An invalid decode part takes the prefill part with it.
	m = good()
	m.Failure = CodeProbeFailed
	if m.PrefillValid() {
		t.Error("prefill valid under a failed decode part")
	}
	m = good()
	m.Prefill = nil
	if m.PrefillValid() {
		t.Error("prefill valid without a prefill part")
	}
}

func TestMaxContextTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		maxLen int64
		ranks  []Rank
		want   int64
	}{
		{"unknown", 0, nil, 0},
		{"model length only", 40960, nil, 40960},
		{"pool only", 0, []Rank{{0, 24094}}, 24094},
		{"pool holds the model length", 32768, []Rank{{0, 200000}}, 32768},
		{"smallest rank decides", 40960, []Rank{{0, 24094}, {1, 2925}}, 2925},
		{"smallest rank, first listed", 40960, []Rank{{0, 2925}, {1, 24094}}, 2925},
	} {
		e := Engine{MaxModelLen: tc.maxLen, Ranks: tc.ranks}
		if got := e.MaxContextTokens(); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// What an engine holds on its GPUs, now or in its measured burst, names
// each GPU once, by UUID, in a bounded list; a list that does not is
// refused whole.
func TestGPUMemoryChecked(t *testing.T) {
	many := make([]GPUMemory, MaxListItems+1)
	for i := range many {
		many[i] = GPUMemory{UUID: fmt.Sprintf("GPU-%d", i), UsedBytes: 1}
	}
	bad := map[string][]GPUMemory{
		"no uuid":       {{UsedBytes: 1 << 30}},
		"a GPU twice":   {{UUID: "GPU-a", UsedBytes: 1}, {UUID: "GPU-a", UsedBytes: 2}},
		"a huge uuid":   {{UUID: strings.Repeat("x", MaxStringBytes+1)}},
		"too many GPUs": many,
	}
	for name, list := range bad {
		t.Run("engine "+name, func(t *testing.T) {
			s := validSnapshot()
			s.Engines[0].GPUMemory = list
			data, _ := json.Marshal(Envelope{Type: TypeSnapshot, Version: ProtocolVersion, Snapshot: s})
			if _, err := Decode(data); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
		t.Run("measurement "+name, func(t *testing.T) {
			m := Measurement{CapacityKey: "k", GPUMemory: list}
			if err := m.Validate(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	m := Measurement{CapacityKey: "k", GPUMemory: []GPUMemory{{UUID: "GPU-a", UsedBytes: 20 << 30}, {UUID: "GPU-b"}}}
	if err := m.Validate(); err != nil {
		t.Errorf("two GPUs, one holding nothing: %v", err)
	}
}

// A load's numbers have an upper bound as well as a lower: kv_usage is a
// fraction of a pool (a real engine's overshoot of it passes, a
// percentage does not), stale_seconds at most what an agent's uptime
// gives, and request counts at most what the agent reads from an engine.
func TestLoadBounds(t *testing.T) {
	const day = 24 * 60 * 60
	tests := []struct {
		name string
		set  func(*Load)
		says string // "" when accepted
	}{
		{"full pool", func(l *Load) { l.KVUsage, l.Ranks[0].KVUsage = 1, 1 }, ""},
		{"rounded past full", func(l *Load) { l.KVUsage, l.Ranks[0].KVUsage = 1.02, 1.02 }, ""},
		{"twice the pool", func(l *Load) { l.KVUsage = MaxKVUsage }, ""},
		{"a percentage", func(l *Load) { l.KVUsage = 85 }, "load.kv_usage is 85, above 2"},
		{"largest float", func(l *Load) { l.KVUsage = math.MaxFloat64 }, "load.kv_usage"},
		{"a rank's percentage", func(l *Load) { l.Ranks[0].KVUsage = 38 }, "load.ranks.kv_usage is 38"},
		{"stale a week", func(l *Load) { l.StaleSeconds = 7 * day }, ""},
		{"stale a year and more", func(l *Load) { l.StaleSeconds = 400 * day }, ""},
		{"stale ten years", func(l *Load) { l.StaleSeconds = MaxStaleSeconds }, ""},
		{"stale past ten years", func(l *Load) { l.StaleSeconds = MaxStaleSeconds + 1 }, "load.stale_seconds"},
		{"stale for ever", func(l *Load) { l.StaleSeconds = 1e300 }, "load.stale_seconds"},
		{"rank at the bound", func(l *Load) { l.Ranks[0].Running, l.Ranks[0].Waiting = MaxRequests, MaxRequests }, ""},
		{"rank past the bound", func(l *Load) { l.Ranks[0].Waiting = MaxRequests + 1 }, "load rank 0 counts"},
		{"totals at the bound", func(l *Load) { l.Running, l.Waiting = MaxRequests*MaxRanks, MaxRequests*MaxRanks }, ""},
		{"total past the bound", func(l *Load) { l.Running = math.MaxInt }, "load counts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSnapshot()
			s.Engines[0].Load = Load{Known: true, Running: 3, Waiting: 1, KVUsage: 0.4,
				Ranks: []RankLoad{{DPRank: 0, Running: 3, Waiting: 1, KVUsage: 0.4}}}
			tt.set(&s.Engines[0].Load)
			data, err := json.Marshal(Envelope{Version: ProtocolVersion, Type: TypeSnapshot, Snapshot: s})
			if err != nil {
				t.Fatal(err)
			}
			_, err = Decode(data)
			switch {
			case tt.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.says != "" && !errors.Is(err, ErrInvalid):
				t.Fatalf("err = %v, want %v", err, ErrInvalid)
			case tt.says != "" && !strings.Contains(err.Error(), tt.says):
				t.Errorf("err %q does not say %q", err, tt.says)
			}
		})
	}
}
