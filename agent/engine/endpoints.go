package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"

	"heft/shared/wire"
)

// The engines' own endpoints, one small reader each. See
// shared/reference/engines.md for what each one really says.

// models reads /v1/models (every kind serves it).
func (c *Client) models(ctx context.Context) ([]string, error) {
	var resp struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := c.getJSON(ctx, "/v1/models", &resp); err != nil {
		return nil, err
	}
	var out []string
	for _, m := range resp.Data {
		if m.ID != "" && len(out) < wire.MaxListItems {
			out = append(out, bound(m.ID))
		}
	}
	return out, nil
}

// version reads the engine's version where it has an endpoint for it.
func (c *Client) version(ctx context.Context) (string, error) {
	var resp struct {
		Version string `json:"version"`
	}
	switch c.kind {
	case wire.EngineVLLM:
		if err := c.getJSON(ctx, "/version", &resp); err != nil {
			return "", err
		}
	case wire.EngineOllama:
		if err := c.getJSON(ctx, "/api/version", &resp); err != nil {
			return "", err
		}
	default:
		return "", nil
	}
	return bound(resp.Version), nil
}

// ready asks the health endpoint. A 503 (llama.cpp loading its model,
// vLLM starting) is "not ready", not an error.
func (c *Client) ready(ctx context.Context) (bool, error) {
	path := "/health"
	if c.kind == wire.EngineOllama {
		path = "/api/version"
	}
	_, status, err := c.get(ctx, path, "")
	if err != nil {
		if status == 503 {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// scrape reads /metrics (vLLM, SGLang with --enable-metrics, llama.cpp
// with --metrics). A page that is not served gives errNotServed.
func (c *Client) scrape(ctx context.Context) (MetricsFacts, error) {
	body, _, err := c.get(ctx, "/metrics", "text/plain;version=0.0.4")
	if err != nil {
		return MetricsFacts{}, err
	}
	return ParseMetrics(c.kind, bytes.NewReader(body))
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
		DPRank      *int `json:"dp_rank"`
		MemoryUsage struct {
			TokenCapacity float64 `json:"token_capacity"`
		} `json:"memory_usage"`
	}
	if json.Unmarshal(raw["internal_states"], &states) == nil && len(states) <= wire.MaxRanks {
		info.Ranked = len(states) > 0
		seen := map[int]bool{}
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

// sglangLoads reads /v1/loads (newest SGLang): per-rank load and pools.
func (c *Client) sglangLoads(ctx context.Context) (wire.Load, []wire.Rank, error) {
	body, _, err := c.get(ctx, "/v1/loads?include=core,memory", "application/json")
	if err != nil {
		return wire.Load{}, nil, err
	}
	type entry struct {
		DPRank            int     `json:"dp_rank"`
		NumRunningReqs    float64 `json:"num_running_reqs"`
		NumWaitingReqs    float64 `json:"num_waiting_reqs"`
		MaxTotalNumTokens float64 `json:"max_total_num_tokens"`
		TokenUsage        float64 `json:"token_usage"`
	}
	var entries []entry
	if looksLikeHTML(body) {
		return wire.Load{}, nil, errors.New("GET /v1/loads answered HTML, not JSON")
	}
	// The answer is {"loads":[...]} or, in some builds, the bare list.
	var wrapped struct {
		Loads []entry `json:"loads"`
	}
	if err := json.Unmarshal(body, &wrapped); err == nil && wrapped.Loads != nil {
		entries = wrapped.Loads
	} else if err := json.Unmarshal(body, &entries); err != nil {
		return wire.Load{}, nil, fmt.Errorf("GET /v1/loads answered something that is not the expected JSON: %v", err)
	}
	var ranks []wire.RankLoad
	var pools []wire.Rank
	seen := map[int]bool{}
	for _, e := range entries {
		if e.DPRank < 0 || e.DPRank >= wire.MaxRanks || seen[e.DPRank] {
			continue
		}
		seen[e.DPRank] = true
		ranks = append(ranks, wire.RankLoad{DPRank: e.DPRank, Running: count(e.NumRunningReqs),
			Waiting: count(e.NumWaitingReqs), KVUsage: fraction(e.TokenUsage)})
		if t := tokens(e.MaxTotalNumTokens); t > 0 {
			pools = append(pools, wire.Rank{DPRank: e.DPRank, KVTokens: t})
		}
	}
	sort.Slice(ranks, func(i, j int) bool { return ranks[i].DPRank < ranks[j].DPRank })
	sort.Slice(pools, func(i, j int) bool { return pools[i].DPRank < pools[j].DPRank })
	return sumLoad(ranks), pools, nil
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

// llamaProps is the part of llama-server's /props heft reads.
type llamaProps struct {
	NCtx       int64 // per slot
	TotalSlots int64
	ModelAlias string
	ModelPath  string
	BuildInfo  string
}

func (c *Client) llamaProps(ctx context.Context) (llamaProps, error) {
	var resp struct {
		DefaultGenerationSettings struct {
			NCtx float64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots float64 `json:"total_slots"`
		ModelAlias string  `json:"model_alias"`
		ModelPath  string  `json:"model_path"`
		BuildInfo  string  `json:"build_info"`
	}
	if err := c.getJSON(ctx, "/props", &resp); err != nil {
		return llamaProps{}, err
	}
	return llamaProps{NCtx: tokens(resp.DefaultGenerationSettings.NCtx), TotalSlots: tokens(resp.TotalSlots),
		ModelAlias: bound(resp.ModelAlias), ModelPath: bound(resp.ModelPath), BuildInfo: bound(resp.BuildInfo)}, nil
}

// llamaSlots counts busy slots in /slots (on unless --no-slots).
func (c *Client) llamaSlots(ctx context.Context) (wire.Load, error) {
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	if err := c.getJSON(ctx, "/slots", &slots); err != nil {
		return wire.Load{}, err
	}
	busy := 0
	for _, s := range slots {
		if s.IsProcessing {
			busy++
		}
	}
	return wire.Load{Known: true, Running: busy, Ranks: []wire.RankLoad{{DPRank: 0, Running: busy}}}, nil
}

// ollamaModel is one model Ollama has loaded.
type ollamaModel struct {
	Name          string
	ContextLength int64
	SizeVRAM      int64
}

func (c *Client) ollamaPS(ctx context.Context) ([]ollamaModel, error) {
	var resp struct {
		Models []struct {
			Name          string  `json:"name"`
			Model         string  `json:"model"`
			SizeVRAM      float64 `json:"size_vram"`
			ContextLength float64 `json:"context_length"`
		} `json:"models"`
	}
	if err := c.getJSON(ctx, "/api/ps", &resp); err != nil {
		return nil, err
	}
	var out []ollamaModel
	for _, m := range resp.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		if name == "" || len(out) >= wire.MaxListItems {
			continue
		}
		out = append(out, ollamaModel{Name: bound(name), ContextLength: tokens(m.ContextLength), SizeVRAM: tokens(m.SizeVRAM)})
	}
	return out, nil
}

func sumLoad(ranks []wire.RankLoad) wire.Load {
	l := wire.Load{Known: len(ranks) > 0, Ranks: ranks}
	for _, r := range ranks {
		l.Running += r.Running
		l.Waiting += r.Waiting
		l.KVUsage = max(l.KVUsage, r.KVUsage)
	}
	return l
}

// count turns a JSON number into a request count, 0 when absurd.
func count(v float64) int {
	if math.IsNaN(v) || v < 0 || v > maxCount {
		return 0
	}
	return int(v)
}

// tokens turns a JSON number into a token count, 0 when absurd.
func tokens(v float64) int64 {
	if math.IsNaN(v) || v < 0 || v > maxKVTokens {
		return 0
	}
	return int64(v)
}

// fraction clamps a usage to 0..1, 0 when absurd.
func fraction(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	return min(v, 1)
}

// bound cuts a string an engine sent to what the wire accepts.
func bound(s string) string { return wire.Clip(s, wire.MaxStringBytes) }
