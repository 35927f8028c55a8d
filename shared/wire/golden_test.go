package wire

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"heft/shared/testutil"
)

// fullMessages holds one message of each type with every field set, so
// that every JSON name of the protocol appears in a golden file.
func fullMessages() map[string]any {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	host := Host{Hostname: "gpu-a", OS: "linux", Platform: "ubuntu", PlatformVersion: "24.04",
		KernelVersion: "6.8.0-48-generic", Arch: "amd64", CPUModel: "AMD EPYC 9654 96-Core Processor", CPUCores: 192,
		MemoryTotal: 1 << 40, MemoryAvailable: 1 << 39, UnifiedMemory: true}
	proc := GPUProcess{PID: 4242, Name: "python3", UsedMemory: 20 << 30, Foreign: true}
	load := Load{Known: true, Running: 3, Waiting: 1, KVUsage: 0.25, StaleSeconds: 31.5,
		Ranks: []RankLoad{{DPRank: 1, Running: 3, Waiting: 1, KVUsage: 0.25}}}
	measurement := Measurement{CapacityKey: "gpu-a:sglang:Qwen/Qwen3-8B:3f9c", Node: "gpu-a", EngineKind: EngineSGLang,
		EngineURL: "http://127.0.0.1:30000", Model: "Qwen/Qwen3-8B",
		ThroughputTPS: 992.5, WarmupTPS: 453.25, OutputTokens: 2047, ExpectedTokens: 2048, WallSeconds: 4.5,
		Requests: 16, Concurrency: 16, TokensPerReq: 128, Prompt: "Write a long story.",
		DecodeTPSP50: 62.5, DecodeTPSP95: 70.25, TTFTP50: 0.125, TTFTP95: 0.5,
		SMClockMinMHz: 1980, SMClockMedianMHz: 2010, SMClockMaxMHz: 2040, ClockEventReasons: []string{"sw_power_cap"},
		GPUMemory:  []GPUMemory{{UUID: "GPU-5f1c", UsedBytes: 21 << 30}},
		LoadBefore: load, Busy: true, Ranks: 2, BusyWaitSeconds: 12.5, Drained: true, EngineGeneratedTokens: 2050, Complete: true, Failure: "probe_incomplete_output", Problems: []string{"1 token short"},
		Implausible: "every token of a request arrived in one instant",
		Trigger:     ReasonScheduled, Cause: "engine_restarted: pid 41 → 97", StartedAt: at, FinishedAt: at.Add(4500 * time.Millisecond),
		Prefill: &Prefill{ThroughputTPS: 17580.25, WarmupTPS: 17001.5, PromptTokens: 32768, ExpectedPromptTokens: 32768,
			WallSeconds: 1.875, PromptLength: 8192, Requests: 4, Concurrency: 4, TTFTP50: 0.9375, TTFTP95: 1.8125,
			CachedTokens: 12, TokenSource: "usage", Complete: true, Failure: PrefillTruncated,
			Problems: []string{"request 2: usage says 4096 prompt tokens, 8192 were sent"}}}
	return map[string]any{
		TypeHello: &Hello{Node: "gpu-a", AgentVersion: "0.2.0", Host: host, NodeCredential: "hn1-credential", KeepsCredential: true,
			Measurements: []CachedMeasurement{{Measurement: measurement, ExpiresAt: at.Add(6 * time.Hour)}}},
		TypeSnapshot: &Snapshot{Node: "gpu-a", At: at, Host: host, GPUError: "GPU 1 could not be read",
			GPUs: []GPU{{Index: 1, UUID: "GPU-5f1c", Name: "NVIDIA L4", MemoryTotal: 24 << 30, MemoryFree: 2 << 30,
				MemoryUsed: 22 << 30, SMClockMHz: 1980, SMClockMaxMHz: 2040, MemClockMHz: 6251, MemClockMaxMHz: 6251,
				ClockEventReasons: []string{"gpu_idle"}, TemperatureC: 61.5, PowerDrawW: 70.25, PowerLimitW: 72,
				UtilizationPercent: 97, Processes: []GPUProcess{proc}, Unsupported: []string{"power_limit"}, Error: "partly read"}},
			Engines: []Engine{{Kind: EngineSGLang, URL: "http://127.0.0.1:30000", Model: "Qwen/Qwen3-8B",
				Models: []string{"Qwen/Qwen3-8B"}, Version: "0.5.4", Ready: true, Error: "metrics: timeout",
				CapacityKey: "gpu-a:sglang:Qwen/Qwen3-8B:3f9c", LaunchArgs: []string{"--dp-size=2"}, LaunchArgsSource: "cmdline",
				PID: 4242, GPUUUIDs: []string{"GPU-5f1c"}, ForeignProcesses: []GPUProcess{proc}, GPUMemory: []GPUMemory{{UUID: "GPU-5f1c", UsedBytes: 20 << 30}}, Load: load,
				MaxRunning: 32, MaxRunningSource: "v1_loads", AdvertiseURL: "http://10.0.0.5:30000",
				AdvertiseSource: AdvertiseNodeAddress, Listen: []string{"0.0.0.0:30000"},
				Ranks: []Rank{{DPRank: 1, KVTokens: 2925}}, RanksSource: "k8s:inference/sglang-0/sglang", RanksAt: at,
				ExpectedRanks: 2, Complete: new(false), MissingRanks: []int{0},
				PoolCheck: &PoolCheck{Source: "metrics", Ranks: []Rank{{DPRank: 1, KVTokens: 2925}}},
				LogSource: &LogSource{Spec: "k8s:inference/sglang-0/sglang", Resolved: "/var/log/pods/inference_sglang-0_5f1c/sglang/0.log",
					Via: "pod log", Wrapper: "cri", Lines: 34, Skipped: 1, Error: "rank 0 still starting"},
				MaxModelLen: 40960, MaxModelLenSource: "v1_models",
				Passive: &Passive{At: at, WindowSeconds: 30, ThroughputTPS: 1791.5, Concurrency: 32, Spread: 0.04},
				Pace: &Pace{At: at, WindowSeconds: 30, SecondsPerToken: 0.0082, Batch: 9.5, TokenBatch: 11.2, ThroughputTPS: 1158.5, PromptTPS: 240,
					Recent: &PaceSpan{WindowSeconds: 15, SecondsPerToken: 0.0091, Batch: 9.8, TokenBatch: 10.9, PromptTPS: 260}}}}},
		TypeProbeResult:  &ProbeResult{RequestID: "r-17", Measurement: measurement},
		TypeProbeStatus:  &ProbeStatus{RequestID: "r-17", CapacityKey: "gpu-a:sglang:Qwen/Qwen3-8B:3f9c", State: ProbeDeferredBusy, Message: "3 requests running"},
		TypeWelcome:      &Welcome{CoordinatorVersion: "0.2.0", SnapshotSeconds: 15, NodeCredential: "hn1-credential"},
		TypeCached:       &CachedMeasurement{Measurement: measurement, ExpiresAt: at.Add(6 * time.Hour)},
		TypeProbeRequest: &ProbeRequest{RequestID: "r-17", CapacityKey: "gpu-a:sglang:Qwen/Qwen3-8B:3f9c", Reason: ReasonOnDemand, Cause: "pace_slower: 15.6 ms per token at 14.0 running per rank, 7.8 ms when measured; capacity rescaled to 1000 tok/s", IdleOnly: true},
	}
}

// TestGoldenMessages pins the protocol: each message type's JSON, with
// every field set, is a file under testdata/messages, and decoding that
// file and encoding it again gives it back byte for byte. A renamed JSON
// name fails here (go test ./shared/wire -update rewrites the files, for a
// protocol change made on purpose: bump ProtocolVersion if an older peer
// cannot read it).
func TestGoldenMessages(t *testing.T) {
	msgs := fullMessages()
	for _, typ := range []string{TypeHello, TypeSnapshot, TypeProbeResult, TypeProbeStatus, TypeWelcome, TypeCached, TypeProbeRequest} {
		t.Run(typ, func(t *testing.T) {
			payload := msgs[typ]
			if zero := zeroFields(reflect.ValueOf(payload).Elem(), typ); len(zero) > 0 {
				t.Fatalf("fields not set, so their JSON names are not pinned: %v", zero)
			}
			data, err := Encode(payload)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "messages", typ+".json")
			testutil.Golden(t, path, indent(t, data))

			golden, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			env, err := Decode(golden)
			if err != nil {
				t.Fatalf("decode %s: %v", path, err)
			}
			if env.Type != typ {
				t.Fatalf("type %q", env.Type)
			}
			again, err := Encode(payloadOf(env))
			if err != nil {
				t.Fatal(err)
			}
			if got := indent(t, again); !bytes.Equal(got, golden) {
				t.Errorf("%s does not survive Decode and Encode:\n%s", path, got)
			}
		})
	}
}

func payloadOf(env *Envelope) any {
	for _, p := range []any{env.Hello, env.Snapshot, env.ProbeResult, env.ProbeStatus, env.Welcome, env.Cached, env.ProbeRequest} {
		if !reflect.ValueOf(p).IsNil() {
			return p
		}
	}
	return nil
}

func indent(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Indent(&b, data, "", "  "); err != nil {
		t.Fatal(err)
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// zeroFields names the fields of v, recursively, left at their zero value.
func zeroFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			if v.Interface().(time.Time).IsZero() {
				return []string{path}
			}
			return nil
		}
		var zero []string
		for i := range v.NumField() {
			zero = append(zero, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return zero
	case reflect.Pointer:
		if !v.IsNil() && v.Elem().Kind() == reflect.Struct {
			return zeroFields(v.Elem(), path)
		}
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		if k := v.Type().Elem().Kind(); k != reflect.Struct && k != reflect.Pointer {
			return nil // elements without JSON names of their own: 0 is a fine value
		}
		var zero []string
		for i := range v.Len() {
			zero = append(zero, zeroFields(v.Index(i), path+"[]")...)
		}
		return zero
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}
