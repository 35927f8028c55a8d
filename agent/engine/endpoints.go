package engine

import (
	"bytes"
	"context"
	"math"

	"heft/shared/wire"
)

// The endpoints more than one kind serves; each kind's own are in its
// file. See shared/reference/engines.md for what each one really says.

// models reads /v1/models (every kind serves it): the model IDs, and the
// max_model_len of those that list one (vLLM, SGLang).
func (c *Client) models(ctx context.Context) ([]string, map[string]int64, error) {
	var resp struct {
		Data []struct {
			ID          string  `json:"id"`
			MaxModelLen float64 `json:"max_model_len"`
		} `json:"data"`
	}
	if err := c.getJSON(ctx, "/v1/models", &resp); err != nil {
		return nil, nil, err
	}
	var out []string
	var lens map[string]int64
	for _, m := range resp.Data {
		if m.ID == "" || len(out) >= wire.MaxListItems {
			continue
		}
		id := bound(m.ID)
		out = append(out, id)
		if n := tokens(m.MaxModelLen); n > 0 {
			if lens == nil {
				lens = map[string]int64{}
			}
			lens[id] = n
		}
	}
	return out, lens, nil
}

// version reads {"version": ...} from path.
func (c *Client) version(ctx context.Context, path string) (string, error) {
	var resp struct {
		Version string `json:"version"`
	}
	if err := c.getJSON(ctx, path, &resp); err != nil {
		return "", err
	}
	return bound(resp.Version), nil
}

// ready asks the kind's health endpoint. A 503 (llama.cpp loading its model,
// vLLM starting) is "not ready", not an error.
func (c *Client) ready(ctx context.Context) (bool, error) {
	_, status, err := c.get(ctx, c.kind.health, "")
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
	return ParseMetrics(c.kind.name, bytes.NewReader(body))
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
