package gpu

import (
	"context"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"heft/shared/testutil"
	"heft/shared/wire"
)

func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: t.Output(), Level: hclog.Debug})
}

func TestDecodeClockEventReasons(t *testing.T) {
	tests := []struct {
		name string
		mask uint64
		want []string
	}{
		{"zero", 0, nil},
		{"idle", 0x1, []string{"gpu_idle"}},
		{"power cap and hw slowdown", 0x4 | 0x8, []string{"sw_power_cap", "hw_slowdown"}},
		{"every known bit", 0x7ff, []string{"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
			"sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
			"display_clock_setting", "board_limit", "reliability"}},
		{"unknown bits only", 0x1800, []string{"unknown_0x1800"}},
		{"known and unknown", 0x40 | 1<<40, []string{"hw_thermal_slowdown", "unknown_0x10000000000"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecodeClockEventReasons(tc.mask); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DecodeClockEventReasons(%#x) = %q, want %q", tc.mask, got, tc.want)
			}
		})
	}
}

func TestParsePowermetricsSamples(t *testing.T) {
	tests := []struct {
		file string
		want PowermetricsGPU
		util float64
	}{
		{"m2max-root.txt", PowermetricsGPU{FrequencyMHz: 1398, ActivePercent: 45.23, IdlePercent: 54.77, PowerW: 2.345,
			HasFrequency: true, HasActive: true, HasIdle: true, HasPower: true}, 45.23},
		{"m1-monterey.txt", PowermetricsGPU{FrequencyMHz: 389, ActivePercent: 1.21, IdlePercent: 98.79, PowerW: 0.003,
			HasFrequency: true, HasActive: true, HasIdle: true, HasPower: true}, 1.21},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(testutil.Testdata(t, "powermetrics", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ParsePowermetrics(f)
			if err != nil {
				t.Fatalf("ParsePowermetrics: %v", err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
			if u, ok := got.Utilization(); !ok || u != tc.util {
				t.Errorf("Utilization() = %v, %v; want %v, true", u, ok, tc.util)
			}
		})
	}
}

func TestParsePowermetricsNoGPUSection(t *testing.T) {
	f, err := os.Open(testutil.Testdata(t, "powermetrics", "no-gpu-section.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ParsePowermetrics(f); !errors.Is(err, ErrNoGPUSection) {
		t.Fatalf("err = %v, want ErrNoGPUSection", err)
	}
}

func TestParsePowermetricsEdgeCases(t *testing.T) {
	const head = "**** GPU usage ****\n\n"
	tests := []struct {
		name    string
		in      string
		want    PowermetricsGPU
		wantErr string
	}{
		{name: "idle residency only gives utilisation", in: head + "GPU idle residency:  90.00%\n",
			want: PowermetricsGPU{IdlePercent: 90, HasIdle: true}},
		{name: "power in watts, unit attached", in: head + "GPU Power: 1.5W\n",
			want: PowermetricsGPU{PowerW: 1.5, HasPower: true}},
		{name: "last sample wins", in: head + "GPU HW active frequency: 444 MHz\n*** Sampled system activity ***\n" + head + "GPU HW active frequency: 1296 MHz\n",
			want: PowermetricsGPU{FrequencyMHz: 1296, HasFrequency: true}},
		{name: "other sections ignored", in: "**** Processor usage ****\nGPU Power: 99 mW\n" + head + "GPU idle residency: 10%\n",
			want: PowermetricsGPU{IdlePercent: 10, HasIdle: true}},
		{name: "empty section", in: head + "GPU SW state: (SW_P1 : 0%)\n", wantErr: "no frequency, residency or power"},
		{name: "empty input", in: "", wantErr: "no \"**** GPU usage ****\" section"},
		{name: "bad number", in: head + "GPU HW active frequency: fast MHz\n", wantErr: "line 3"},
		{name: "unknown unit", in: head + "GPU HW active frequency: 1398 Hz\n", wantErr: "unknown unit"},
		{name: "negative", in: head + "GPU Power: -5 mW\n", wantErr: "non-negative"},
		{name: "not finite", in: head + "GPU Power: NaN mW\n", wantErr: "non-negative"},
		{name: "residency above 100", in: head + "GPU HW active residency: 140% (1398 MHz: 140%)\n", wantErr: "above 100"},
		{name: "residency without percent", in: head + "GPU idle residency: 54.77\n", wantErr: "no percentage"},
		{name: "empty value", in: head + "GPU Power:\n", wantErr: "no value"},
		{name: "overlong line", in: head + "GPU Power: " + strings.Repeat("9", maxPowermetricsLine) + "\n", wantErr: "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePowermetrics(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePowermetrics: %v", err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestAppleGPU(t *testing.T) {
	h := wire.Host{Hostname: "studio", OS: "darwin", Arch: "arm64", CPUModel: "Apple M2 Max",
		MemoryTotal: 96 << 30, MemoryAvailable: 60 << 30, UnifiedMemory: true}
	always := []string{"uuid", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz",
		"clock_event_reasons", "temperature_c", "power_limit_w", "processes"}

	t.Run("root with a full sample", func(t *testing.T) {
		pm := &PowermetricsGPU{FrequencyMHz: 1397.6, ActivePercent: 45.23, IdlePercent: 54.77, PowerW: 2.345,
			HasFrequency: true, HasActive: true, HasIdle: true, HasPower: true}
		want := wire.GPU{Name: "Apple M2 Max (integrated)", MemoryTotal: 96 << 30, MemoryFree: 60 << 30, MemoryUsed: 36 << 30,
			SMClockMHz: 1398, UtilizationPercent: 45.23, PowerDrawW: 2.345, Unsupported: always}
		got := appleGPU(h, pm, nil)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got  %+v\nwant %+v", got, want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("wire validation: %v", err)
		}
	})
	t.Run("not root", func(t *testing.T) {
		got := appleGPU(h, nil, nil)
		for _, f := range []string{"sm_clock_mhz", "utilization_percent", "power_draw_w"} {
			if !slices.Contains(got.Unsupported, f) {
				t.Errorf("Unsupported = %q, lacks %q", got.Unsupported, f)
			}
		}
		if got.MemoryTotal != 96<<30 || got.Error != "" {
			t.Errorf("memory %d, error %q: want host memory and no error", got.MemoryTotal, got.Error)
		}
	})
	t.Run("powermetrics failed, no host memory, no model", func(t *testing.T) {
		got := appleGPU(wire.Host{OS: "darwin"}, nil, errors.New("exit status 1"))
		if got.Name != "Apple GPU (integrated)" {
			t.Errorf("Name = %q", got.Name)
		}
		if got.Error != "powermetrics: exit status 1" {
			t.Errorf("Error = %q", got.Error)
		}
		if !slices.Contains(got.Unsupported, "memory_total_bytes") {
			t.Errorf("Unsupported = %q, lacks memory_total_bytes", got.Unsupported)
		}
	})
}

// TestOpenHere runs the platform's Open on this machine. Without a driver
// (the usual build host) it must still give a usable Source and say why.
func TestOpenHere(t *testing.T) {
	src, err := Open(testLogger(t))
	if src == nil {
		t.Fatal("Open returned a nil Source")
	}
	defer src.Close()
	gpus, derr := src.Devices(context.Background())
	if derr != nil {
		t.Fatalf("Devices: %v", derr)
	}
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open error %v does not wrap ErrUnavailable", err)
		}
		t.Logf("Open said: %v (%d devices)", err, len(gpus))
	}
	for i := range gpus {
		if err := gpus[i].Validate(); err != nil {
			t.Errorf("gpu %d: %v", i, err)
		}
	}
}

func TestJoinErrorsBounded(t *testing.T) {
	long := errors.New(strings.Repeat("é", wire.MaxStringBytes))
	s := joinErrors([]error{long, long})
	if len(s) > wire.MaxStringBytes || !strings.HasSuffix(s, "…") || !utf8.ValidString(s) {
		t.Errorf("len %d, suffix %q, valid %v", len(s), s[len(s)-3:], utf8.ValidString(s))
	}
}
