package sim

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	ok := Config{SingleTPS: 60, Batch16TPS: 600}
	with := func(f func(*Config)) Config { c := ok; f(&c); return c }
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no calibration", Config{}, "single-tps must be a positive number"},
		{"no batch16", Config{SingleTPS: 60}, "batch16-tps must be a positive number"},
		{"NaN", with(func(c *Config) { c.SingleTPS = math.NaN() }), "single-tps"},
		{"batching slower", with(func(c *Config) { c.Batch16TPS = 50 }), "must be at least single-tps"},
		{"batching free", with(func(c *Config) { c.Batch16TPS = 960 }), "must be below 16 × single-tps"},
		{"flavor", with(func(c *Config) { c.Flavor = "tgi" }), `unknown flavor "tgi"`},
		{"dp negative", with(func(c *Config) { c.DP = -1 }), "dp must be between 1 and"},
		{"spec accept negative", with(func(c *Config) { c.SpecAccept = -1 }), "spec-accept must be 0 to 16"},
		{"spec accept huge", with(func(c *Config) { c.SpecAccept = 17 }), "spec-accept must be 0 to 16"},
		{"dp on mlx", with(func(c *Config) { c.Flavor = FlavorMLX; c.DP = 2 }), "flavor mlx has no data parallelism"},
		{"kv count", with(func(c *Config) { c.DP = 3; c.KVTokens = []int64{1, 2} }), "kv-tokens has 2 values but dp is 3"},
		{"kv zero", with(func(c *Config) { c.KVTokens = []int64{0} }), "kv-tokens[0] must be positive"},
		{"cold below one", with(func(c *Config) { c.ColdFactor = 0.5; c.ColdSeconds = 1 }), "cold-factor must be a number ≥ 1"},
		{"cold without time", with(func(c *Config) { c.ColdFactor = 3 }), "needs cold-seconds > 0"},
		{"cold seconds negative", with(func(c *Config) { c.ColdSeconds = -1 }), "cold-seconds must be"},
		{"prompt tokens", with(func(c *Config) { c.PromptTokens = -1 }), "prompt-tokens"},
		{"max running", with(func(c *Config) { c.MaxRunning = -1 }), "max-running"},
		{"faults", with(func(c *Config) { c.Faults.NotReadyFor = -time.Second }), "fault values"},
		{"log pools count", with(func(c *Config) { c.DP = 3; c.Faults.LogKVTokens = []int64{1, 2} }), "fault-log-kv-tokens has 2 values but dp is 3"},
		{"log pools zero", with(func(c *Config) { c.Faults.LogKVTokens = []int64{0} }), "fault-log-kv-tokens must be positive"},
		{"log pools on llama.cpp", with(func(c *Config) { c.Flavor = FlavorLlamaCpp; c.Faults.LogKVTokens = []int64{5} }), "prints no per-rank pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Start(tc.cfg, "127.0.0.1:0")
			if err == nil {
				s.Close()
				t.Fatalf("Start accepted %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	s := startSim(t, Config{Flavor: FlavorSGLang, SingleTPS: 60, Batch16TPS: 600, DP: 3, KVTokens: []int64{5000}})
	c := s.Config()
	if c.Model != DefaultModel || c.Version == "" || c.ColdFactor != 1 || c.MaxRunning != 2048 {
		t.Errorf("defaults not filled: %+v", c)
	}
	if got := s.Ranks(); len(got) != 3 || got[0] != 5000 || got[2] != 5000 {
		t.Errorf("one kv-tokens value should apply to every rank: %v", got)
	}
	if got := startSim(t, ok()).Ranks(); len(got) != 1 || got[0] != DefaultKVTokens {
		t.Errorf("default pool %v", got)
	}
}

func ok() Config { return Config{SingleTPS: 60, Batch16TPS: 600} }

func TestCalibrate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ s1, s16 float64 }{{200, 1600}, {60, 600}, {100, 100}, {10, 159}} {
		t0, k, err := calibrate(tc.s1, tc.s16)
		if err != nil {
			t.Fatalf("%v: %v", tc, err)
		}
		if one := t0 + k; math.Abs(one-1/tc.s1) > 1e-12 {
			t.Errorf("%v: t0+k = %v, want %v", tc, one, 1/tc.s1)
		}
		if sixteen := t0 + 16*k; math.Abs(sixteen-16/tc.s16) > 1e-12 {
			t.Errorf("%v: t0+16k = %v, want %v", tc, sixteen, 16/tc.s16)
		}
	}
	m := stepModel{t0: 0.004, k: 0.001, prefillTPS: 1000, start: time.Now(), coldFactor: 3, coldFor: time.Second}
	if f := m.cold(m.start.Add(500 * time.Millisecond)); f != 3 {
		t.Errorf("cold factor inside the cold window %v, want 3", f)
	}
	if f := m.cold(m.start.Add(2 * time.Second)); f != 1 {
		t.Errorf("cold factor after the cold window %v, want 1", f)
	}
	for _, tc := range []struct {
		b               int
		p               int64
		decode, prefill float64
	}{
		{2, 0, 0.006, 0},        // a decode step: t0 + 2k
		{0, 500, 0, 0.5},        // a prefill step: p/P, no t0
		{3, 250, 0.007, 0.25},   // a mixed step: both
		{0, 0, 0, 0},            // nothing
		{1, 2048, 0.005, 2.048}, // a sequence sampling its first token after its last chunk
	} {
		d, p := m.seconds(tc.b, tc.p)
		if math.Abs(d-tc.decode) > 1e-12 || math.Abs(p-tc.prefill) > 1e-12 {
			t.Errorf("seconds(%d, %d) = %v, %v; want %v, %v", tc.b, tc.p, d, p, tc.decode, tc.prefill)
		}
	}
}

func TestPythonFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		got, want string
	}{
		{pyFloat(60), "60.0"},
		{pyFloat(0.5), "0.5"},
		{pyFloat(1e-5), "1e-05"},
		{pyFloat(1234567.5), "1234567.5"},
		{promFloat(10528), "10528.0"},
		{promFloat(1765446090.3547), "1.7654460903547e+09"},
		{promFloat(0.03082719643774619), "0.03082719643774619"},
		{promFloat(math.Inf(1)), "+Inf"},
		{thousands(373696), "373,696"},
		{thousands(999), "999"},
		{thousands(1000), "1,000"},
		{pyStr("it's"), `"it's"`},
		{pyStr(`a'b"c`), `'a\'b"c'`},
		{pyDict([]pyArg{{"model", "Q/Q"}, {"n", 2}, {"f", 1.0}, {"b", true}, {"x", nil}, {"l", []int64{1, 2}}}),
			"{'model': 'Q/Q', 'n': 2, 'f': 1.0, 'b': True, 'x': None, 'l': [1, 2]}"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}
