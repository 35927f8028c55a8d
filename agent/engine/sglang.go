package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"

	"heft/shared/wire"
)

// SGLang (reference/engines.md §2): /server_info for its launch
// arguments, version and per-rank KV pools; /v1/loads (newest), else
// /get_load, for the load as it is, and /metrics with --enable-metrics
// (label dp_rank="k") for its late gauges and counters. It takes
// min_tokens and ignore_eos like vLLM.
var sglang = descriptor{
	name:     wire.EngineSGLang,
	port:     30000,
	programs: []string{"sglang"},
	health:   "/health",
	metrics: &metricNames{
		rankLabel: "dp_rank",
		running:   []string{"sglang:num_running_reqs"},
		waiting:   []string{"sglang:num_queue_reqs"},
		kvUsage:   []string{"sglang:token_usage"},
		pool:      []string{"sglang:max_total_num_tokens"},
		// The gauges are written late; /v1/loads reads the scheduler.
		liveLoad: func(ctx context.Context, c *Client) (wire.Load, bool) {
			l, err := c.sglangLiveLoad(ctx)
			return l.load, err == nil && l.load.Known
		},
		// The tokenizer adds a request's tokens here when it finishes
		// (observe_one_finished_request), so the agent counts tokens as they
		// are sent from its two histograms instead (generatedAtFinish).
		generated:         []string{"sglang:generation_tokens_total"},
		generatedAtFinish: true,
		// The tokenizer's histograms, over every rank: each chunk sent adds
		// its tokens to the count and the time since the last chunk to the
		// sum; a request's first chunk is one time to first token.
		interToken: []string{"sglang:inter_token_latency_seconds"},
		firstToken: []string{"sglang:time_to_first_token_seconds"},
		// Older releases kept, per chunk sent, the request's mean time per
		// token so far: its sum over its count is still a time per token,
		// but its count is chunks and its sum no time.
		meanInterToken: []string{"sglang:time_per_output_token_seconds"},
		prompt:         []string{"sglang:prompt_tokens_total"},
		cached:         []string{"sglang:cached_tokens_total"},
	},
	output: OutputForm{Exact: true, ContinuousUsage: true, Fields: func(n int) map[string]any {
		return map[string]any{"min_tokens": n, "ignore_eos": true}
	}},
	prefill: OutputForm{Exact: true, Fields: func(n int) map[string]any {
		return map[string]any{"min_tokens": n, "ignore_eos": true}
	}},
	// POST /tokenize counts text without the chat template.
	tokenize: &Tokenizer{Path: "/tokenize", Count: countField, Body: func(model, text string) map[string]any {
		return map[string]any{"model": model, "prompt": text}
	}},
	// /v1/models' max_model_len is the context the model runs with;
	// context_length (a launch argument, also in /server_info) is null
	// unless it was set.
	context: contextSource{models: true, args: []string{"context_length"}},
	detect: detection{ownedBy: "sglang", probes: []probe{
		{"/server_info", []string{"tp_size", "model_path"}},
		{"/get_server_info", []string{"tp_size", "model_path"}},
	}},
	running: sglangRunning,
	adapter: sglangAdapter{},
	log:     &sglangLog,
}

// sglangRunning reads --max-running-requests, per rank; with DP attention
// the ranks share it. SGLang's own default is sized from the KV pool, so
// without the argument (or /v1/loads, /server_info) it is unknown.
func sglangRunning(in runningInput) (int, string) {
	n, src, ok := positiveArg(in.args, "max_running_requests")
	if !ok {
		return 0, ""
	}
	if dp, err := strconv.Atoi(in.args["data_parallel_size"]); err == nil && dp > 1 && in.args["enable_dp_attention"] == "true" {
		return max(1, n/dp), src + " shared by the ranks (DP attention)"
	}
	return n, src
}

type sglangAdapter struct{}

// read takes the KV pools from the most truthful source that has them:
// per-rank metrics or /v1/loads, then /server_info's per-rank states
// (only where they cannot mislabel ranks), then its DP0 total for a
// single rank.
func (a sglangAdapter) read(ctx context.Context, c *Client, r *reading) {
	info, err := c.sglangServerInfo(ctx)
	r.note(err)
	if err == nil {
		r.version = info.Version
		r.args, r.argsSrc = info.Args, SourceServerInfo
	}
	var live loadsReply
	if !r.down {
		live = a.readLoad(ctx, c, r)
	}
	switch {
	case info.Running > 0:
		r.running, r.runningSrc = info.Running, SourceServerInfo+" effective_max_running_requests_per_dp"
	case live.running > 0: // older builds say it only in /v1/loads
		r.running, r.runningSrc = live.running, SourceLoads+" max_running_requests"
	}
	if len(r.pools) > 0 || err != nil {
		return
	}
	if caps := info.Capacities; len(caps) > 0 && (info.Ranked || allEqual(caps)) {
		r.pools, r.poolsSrc = caps, SourceServerInfo
	} else if info.DPSize <= 1 && info.MaxTotalNumTokens > 0 {
		r.pools, r.poolsSrc = []wire.Rank{{DPRank: 0, KVTokens: info.MaxTotalNumTokens}}, SourceServerInfo
	}
}

// readLoad reads the load and per-rank pools: /metrics, then the live
// load (sglangLiveLoad), whose requests win over the gauges', and whose
// pools serve where the metrics have none. It returns the live reading.
func (sglangAdapter) readLoad(ctx context.Context, c *Client, r *reading) loadsReply {
	mf, err := c.scrape(ctx)
	r.note(err)
	r.load = mf.Load
	if len(mf.Ranks) > 0 {
		r.pools, r.poolsSrc = mf.Ranks, SourceMetrics
	}
	if r.down {
		return loadsReply{}
	}
	l, err := c.sglangLiveLoad(ctx)
	r.note(err)
	if l.load.Known {
		r.load = withKVUsage(l.load, mf.Load)
	}
	if len(r.pools) == 0 && len(l.pools) > 0 {
		r.pools, r.poolsSrc = l.pools, SourceLoads
	}
	return l
}

// load reads the live load, else the gauges of /metrics.
func (sglangAdapter) load(ctx context.Context, c *Client) (wire.Load, error) {
	l, lerr := c.sglangLiveLoad(ctx)
	if lerr == nil && l.load.Known {
		return l.load, nil
	}
	mf, err := c.scrape(ctx)
	if err == nil && mf.LoadUnreadable {
		err = errLoadUnreadable
	}
	switch {
	case err == nil && mf.Load.Known:
		return mf.Load, nil
	case lerr == nil:
		return l.load, nil
	case err != nil && !errors.Is(err, errNotServed):
		return wire.Load{}, err
	}
	return wire.Load{}, lerr
}

// sglangLiveLoad reads the load as SGLang's scheduler has it when asked:
// /v1/loads (newest), else /get_load. Its /metrics gauges are written
// only on a prefill batch, every --decode-log-interval (40) decode steps
// and, once idle, every 30 s (the scheduler's metrics reporter), so they
// can miss a request that has just begun and show, for half a minute,
// requests that have ended: a probe would wait that long for an engine
// already idle, and a drained worker stay out of the gateways as long.
// An endpoint the engine does not serve is not asked again for
// notServedFor.
func (c *Client) sglangLiveLoad(ctx context.Context) (loadsReply, error) {
	if c.mayAsk("/v1/loads") {
		l, err := c.sglangLoads(ctx)
		if !unavailable(err) {
			return l, err
		}
		c.notServed("/v1/loads")
	}
	if c.mayAsk("/get_load") {
		l, err := c.sglangGetLoad(ctx)
		if !unavailable(err) {
			return loadsReply{load: l}, err
		}
		c.notServed("/get_load")
	}
	return loadsReply{}, fmt.Errorf("neither /v1/loads nor /get_load: %w", errNotServed)
}

// unavailable reports an endpoint the engine does not serve, or refuses
// without a key (SGLang's --api-key covers /v1/loads, not /metrics).
func unavailable(err error) bool {
	var se *statusError
	return errors.Is(err, errNotServed) ||
		errors.As(err, &se) && (se.status == http.StatusUnauthorized || se.status == http.StatusForbidden)
}

// withKVUsage fills in each rank's KV usage from the gauges where the live
// load (/get_load) has none.
func withKVUsage(live, gauges wire.Load) wire.Load {
	if live.KVUsage > 0 || gauges.KVUsage == 0 {
		return live
	}
	usage := map[int]float64{}
	for _, r := range gauges.Ranks {
		usage[r.DPRank] = r.KVUsage
	}
	ranks := slices.Clone(live.Ranks)
	for i := range ranks {
		ranks[i].KVUsage = usage[ranks[i].DPRank]
	}
	return sumLoad(ranks)
}

func allEqual(ranks []wire.Rank) bool {
	for _, r := range ranks[1:] {
		if r.KVTokens != ranks[0].KVTokens {
			return false
		}
	}
	return true
}

// serverInfo is the part of SGLang's /server_info heft reads. Args holds
// every top-level field that is a server argument.
type serverInfo struct {
	Version           string
	DPSize            int
	MaxTotalNumTokens int64 // DP0 only
	Args              map[string]string
	// Capacities are internal_states[i].memory_usage.token_capacity, one
	// per rank, in reply-arrival order; Ranked is true when every state
	// also names its dp_rank.
	Capacities []wire.Rank
	Ranked     bool
	// Running is the sum over ranks of effective_max_running_requests_per_dp
	// (newer builds), 0 unless every rank says.
	Running int
}

// serverInfoSkip are /server_info fields that are scheduler state, not
// launch arguments.
var serverInfoSkip = map[string]bool{
	"version": true, "internal_states": true, "max_total_num_tokens": true, "max_req_input_len": true,
	"status": true, "scheduler_info": true, "last_gen_throughput": true, "memory_usage": true,
	"effective_max_running_requests_per_dp": true, "load": true,
}

// sglangServerInfo reads /server_info, falling back to the deprecated
// /get_server_info of older versions.
func (c *Client) sglangServerInfo(ctx context.Context) (serverInfo, error) {
	body, _, err := c.get(ctx, "/server_info", "application/json")
	if errors.Is(err, errNotServed) {
		body, _, err = c.get(ctx, "/get_server_info", "application/json")
	}
	if err != nil {
		return serverInfo{}, err
	}
	var raw map[string]json.RawMessage
	if err := decodeJSON("/server_info", body, &raw); err != nil {
		return serverInfo{}, err
	}
	info := serverInfo{Args: map[string]string{}}
	_ = json.Unmarshal(raw["version"], &info.Version)
	info.Version = bound(info.Version)
	var n float64
	if json.Unmarshal(raw["max_total_num_tokens"], &n) == nil {
		info.MaxTotalNumTokens = tokens(n)
	}
	if json.Unmarshal(raw["dp_size"], &n) == nil && n >= 0 && n < wire.MaxRanks {
		info.DPSize = int(n)
	}
	for k, v := range raw {
		if serverInfoSkip[k] {
			continue
		}
		if s, ok := jsonScalar(v); ok {
			info.Args[k] = s
		}
	}
	var states []struct {
		DPRank      *int     `json:"dp_rank"`
		Running     *float64 `json:"effective_max_running_requests_per_dp"`
		MemoryUsage struct {
			TokenCapacity float64 `json:"token_capacity"`
		} `json:"memory_usage"`
	}
	if json.Unmarshal(raw["internal_states"], &states) == nil && len(states) <= wire.MaxRanks {
		info.Ranked = len(states) > 0
		seen := map[int]bool{}
		running, all := 0, len(states) > 0
		for _, s := range states {
			if s.Running == nil || count(*s.Running) == 0 {
				all = false
				continue
			}
			running += count(*s.Running)
		}
		if all {
			info.Running = running
		}
		for i, s := range states {
			k := i
			if s.DPRank != nil && *s.DPRank >= 0 && *s.DPRank < wire.MaxRanks && !seen[*s.DPRank] {
				k = *s.DPRank
			} else {
				info.Ranked = false
			}
			seen[k] = true
			if t := tokens(s.MemoryUsage.TokenCapacity); t > 0 {
				info.Capacities = append(info.Capacities, wire.Rank{DPRank: k, KVTokens: t})
			}
		}
		if !info.Ranked {
			// Reply-arrival order: rank numbers would be guesses.
			for i := range info.Capacities {
				info.Capacities[i].DPRank = i
			}
		}
		sort.Slice(info.Capacities, func(i, j int) bool { return info.Capacities[i].DPRank < info.Capacities[j].DPRank })
	}
	return info, nil
}

// jsonScalar renders a JSON scalar as a launch-argument value; lists and
// objects render as compact JSON, null is dropped.
func jsonScalar(v json.RawMessage) (string, bool) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || string(v) == "null" {
		return "", false
	}
	var s string
	if v[0] == '"' {
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	}
	if string(v) == "[]" || string(v) == "{}" {
		return "", false
	}
	return string(v), true
}

// loadsReply is what /v1/loads says: the load and pools per rank, and
// the sum over ranks of max_running_requests (0 unless every rank says).
type loadsReply struct {
	load    wire.Load
	pools   []wire.Rank
	running int
}

// sglangLoadsPath asks /v1/loads for each rank's load and pools.
const sglangLoadsPath = "/v1/loads?include=core,memory"

// sglangLoads reads /v1/loads (newest SGLang): per-rank load and pools.
func (c *Client) sglangLoads(ctx context.Context) (loadsReply, error) {
	body, _, err := c.get(ctx, sglangLoadsPath, "application/json")
	if err != nil {
		return loadsReply{}, err
	}
	type entry struct {
		DPRank            int     `json:"dp_rank"`
		NumRunningReqs    float64 `json:"num_running_reqs"`
		NumWaitingReqs    float64 `json:"num_waiting_reqs"`
		MaxTotalNumTokens float64 `json:"max_total_num_tokens"`
		TokenUsage        float64 `json:"token_usage"`
		MaxRunning        float64 `json:"max_running_requests"`
	}
	var entries []entry
	if looksLikeHTML(body) {
		return loadsReply{}, errors.New("GET /v1/loads answered HTML, not JSON")
	}
	// The answer is {"loads":[...]} or, in some builds, the bare list.
	var wrapped struct {
		Loads []entry `json:"loads"`
	}
	if err := json.Unmarshal(body, &wrapped); err == nil && wrapped.Loads != nil {
		entries = wrapped.Loads
	} else if err := json.Unmarshal(body, &entries); err != nil {
		return loadsReply{}, fmt.Errorf("GET /v1/loads answered something that is not the expected JSON: %v", err)
	}
	var ranks []wire.RankLoad
	var pools []wire.Rank
	seen := map[int]bool{}
	running, all := 0, len(entries) > 0
	for _, e := range entries {
		if e.DPRank < 0 || e.DPRank >= wire.MaxRanks || seen[e.DPRank] {
			continue
		}
		seen[e.DPRank] = true
		if n := count(e.MaxRunning); n > 0 {
			running += n
		} else {
			all = false
		}
		ranks = append(ranks, wire.RankLoad{DPRank: e.DPRank, Running: count(e.NumRunningReqs),
			Waiting: count(e.NumWaitingReqs), KVUsage: fraction(e.TokenUsage)})
		if t := tokens(e.MaxTotalNumTokens); t > 0 {
			pools = append(pools, wire.Rank{DPRank: e.DPRank, KVTokens: t})
		}
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i].DPRank < ranks[j].DPRank })
	sort.Slice(pools, func(i, j int) bool { return pools[i].DPRank < pools[j].DPRank })
	out := loadsReply{load: sumLoad(ranks), pools: pools}
	if all {
		out.running = running
	}
	return out, nil
}

// sglangGetLoad reads the older /get_load list. num_reqs counts running
// and waiting requests together in the versions that have both fields.
func (c *Client) sglangGetLoad(ctx context.Context) (wire.Load, error) {
	var entries []struct {
		DPRank         int     `json:"dp_rank"`
		NumReqs        float64 `json:"num_reqs"`
		NumWaitingReqs float64 `json:"num_waiting_reqs"`
	}
	if err := c.getJSON(ctx, "/get_load", &entries); err != nil {
		return wire.Load{}, err
	}
	var ranks []wire.RankLoad
	seen := map[int]bool{}
	for _, e := range entries {
		if e.DPRank < 0 || e.DPRank >= wire.MaxRanks || seen[e.DPRank] {
			continue
		}
		seen[e.DPRank] = true
		total, waiting := count(e.NumReqs), count(e.NumWaitingReqs)
		running := total - waiting
		if running < 0 {
			running = total
		}
		ranks = append(ranks, wire.RankLoad{DPRank: e.DPRank, Running: running, Waiting: waiting})
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i].DPRank < ranks[j].DPRank })
	return sumLoad(ranks), nil
}
