package health

import (
	"slices"
	"strings"
	"testing"

	"heft/shared/wire"
)

func codes(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Code+"/"+f.Severity)
	}
	return out
}

// An incomplete set is never called even and never holds; an imbalance
// already visible among its ranks is named, as a warning.
func TestPoolFindingsIncomplete(t *testing.T) {
	th := DefaultThresholds()
	starved := []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373696}, {DPRank: 2, KVTokens: 46704}}
	even := []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373696}, {DPRank: 2, KVTokens: 373696}}
	for _, tc := range []struct {
		name  string
		e     wire.Engine
		want  []string
		hold  bool
		ratio bool
	}{
		{"older agent, uneven: held as before", wire.Engine{Ranks: starved}, []string{"dp_pool_imbalance/critical"}, true, true},
		{"whole and uneven", wire.Engine{Ranks: starved, ExpectedRanks: 3, Complete: new(true)}, []string{"dp_pool_imbalance/critical"}, true, true},
		{"whole and even", wire.Engine{Ranks: even, ExpectedRanks: 3, Complete: new(true)}, nil, false, true},
		{"three of four, even so far", wire.Engine{Ranks: even, ExpectedRanks: 4, Complete: new(false), MissingRanks: []int{3}},
			[]string{"pools_incomplete/warning"}, false, false},
		{"three of four, one starved", wire.Engine{Ranks: starved, ExpectedRanks: 4, Complete: new(false), MissingRanks: []int{3}},
			[]string{"dp_pool_imbalance/warning", "pools_incomplete/warning"}, false, false},
		{"one of two", wire.Engine{Ranks: starved[:1], ExpectedRanks: 2, Complete: new(false), MissingRanks: []int{1}},
			[]string{"pools_incomplete/warning"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := PoolFindings(tc.e, th)
			Sort(fs)
			if got := codes(fs); !slices.Equal(got, tc.want) {
				t.Fatalf("findings %v, want %v: %+v", got, tc.want, fs)
			}
			if got := PoolsHold(tc.e, th); got != tc.hold {
				t.Errorf("PoolsHold = %v, want %v", got, tc.hold)
			}
			if _, ok := EnginePoolRatio(tc.e); ok != tc.ratio {
				t.Errorf("a ratio given: %v, want %v", ok, tc.ratio)
			}
			for _, f := range fs {
				if strings.Contains(f.Message, "even or an admin") && !Whole(tc.e) {
					t.Errorf("an incomplete set is told it is held: %s", f.Message)
				}
			}
		})
	}
	fs := PoolFindings(wire.Engine{Ranks: starved, ExpectedRanks: 4, Complete: new(false), MissingRanks: []int{3}}, th)
	Sort(fs)
	for _, want := range []string{"among the 3 of 4 ranks", "rank 2 only 46,704", "every fourth request", "not held while the set is incomplete"} {
		if !strings.Contains(fs[0].Message, want) {
			t.Errorf("imbalance message lacks %q:\n%s", want, fs[0].Message)
		}
	}
	for _, want := range []string{"expected 4 data-parallel ranks but 3 printed a KV pool; none from DP 3", "not judged balanced"} {
		if !strings.Contains(fs[1].Message, want) {
			t.Errorf("incomplete message lacks %q:\n%s", want, fs[1].Message)
		}
	}
}

func TestPoolsUnknown(t *testing.T) {
	dp2 := []string{"data_parallel_size=2", "model=Qwen/Qwen3-8B"}
	for _, tc := range []struct {
		name string
		e    wire.Engine
		says string // "" = no finding
	}{
		{"single rank, no pools", wire.Engine{Ready: true}, ""},
		{"DP2 from the launch args, no pools", wire.Engine{Ready: true, LaunchArgs: dp2}, "runs 2 data-parallel ranks but no KV pool of any is known: no start-up log is configured"},
		{"DP4 from the agent, no pools", wire.Engine{Ready: true, ExpectedRanks: 4, Complete: new(false), MissingRanks: []int{0, 1, 2, 3}}, "runs 4 data-parallel ranks"},
		{"DP2 not ready yet", wire.Engine{LaunchArgs: dp2}, ""},
		{"DP2 with pools", wire.Engine{Ready: true, LaunchArgs: dp2, Ranks: []wire.Rank{{DPRank: 0, KVTokens: 1}, {DPRank: 1, KVTokens: 1}}}, ""},
		{"DP2, the log has no pool line", wire.Engine{Ready: true, LaunchArgs: dp2, LogSource: &wire.LogSource{Spec: "docker:vllm", Lines: 1200}},
			"its start-up log (docker:vllm, 1,200 lines read) has printed no KV pool line"},
		{"the log cannot be read", wire.Engine{LogSource: &wire.LogSource{Spec: "journald:vllm.service", Error: "no entries for unit vllm.service"}},
			"start-up log (journald:vllm.service) cannot be read: no entries for unit vllm.service"},
		{"the log cannot be read, pools from metrics", wire.Engine{Ranks: []wire.Rank{{DPRank: 0, KVTokens: 5}},
			LogSource: &wire.LogSource{Spec: "journald:vllm.service", Error: "x"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := PoolsUnknown(tc.e)
			switch {
			case tc.says == "" && f != nil:
				t.Fatalf("unexpected %+v", f)
			case tc.says != "" && (f == nil || f.Code != wire.CodePoolsUnknown || f.Severity != wire.SeverityWarning || !strings.Contains(f.Message, tc.says)):
				t.Fatalf("finding %+v, want pools_unknown saying %q", f, tc.says)
			}
		})
	}
}

func TestPoolsDisagree(t *testing.T) {
	log := []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 2925}}
	for _, tc := range []struct {
		name  string
		check *wire.PoolCheck
		says  []string // nil = no finding
	}{
		{"no check", nil, nil},
		{"agree", &wire.PoolCheck{Source: "metrics", Ranks: log}, nil},
		{"within rounding", &wire.PoolCheck{Source: "metrics", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24000}, {DPRank: 1, KVTokens: 2920}}}, nil},
		{"not reported yet", &wire.PoolCheck{Source: "metrics", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 0}, {DPRank: 1, KVTokens: 0}}}, nil},
		{"rank 1 differs", &wire.PoolCheck{Source: "metrics", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 24094}}},
			[]string{"rank 1: 2,925 tokens in the log, 24,094 in /metrics", "k8s:ns/sglang-0/sglang"}},
		{"from /v1/loads", &wire.PoolCheck{Source: "v1_loads", Ranks: []wire.Rank{{DPRank: 0, KVTokens: 1000}}},
			[]string{"rank 0: 24,094 tokens in the log, 1,000 in /v1/loads"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := PoolsDisagree(wire.Engine{Ranks: log, RanksSource: "k8s:ns/sglang-0/sglang", PoolCheck: tc.check})
			if tc.says == nil {
				if f != nil {
					t.Fatalf("unexpected %+v", f)
				}
				return
			}
			if f == nil || f.Code != wire.CodePoolsDisagree || f.Severity != wire.SeverityWarning {
				t.Fatalf("finding %+v, want a pools_disagree warning", f)
			}
			for _, want := range tc.says {
				if !strings.Contains(f.Message, want) {
					t.Errorf("message lacks %q:\n%s", want, f.Message)
				}
			}
		})
	}
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{nil, ""}, {[]int{3}, "3"}, {[]int{1, 2}, "1, 2"}, {[]int{1, 2, 3, 7, 9, 10, 11, 12}, "1-3, 7, 9-12"},
	} {
		if got := RankList(tc.in); got != tc.want {
			t.Errorf("RankList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
