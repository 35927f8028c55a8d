package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"heft/shared/wire"
)

// DefaultPorts are where each engine listens unless told otherwise.
// llama-server and mlx-lm's server share 8080; Detect tells them apart.
var DefaultPorts = []struct {
	Port  int
	Kinds []string
}{
	{8000, []string{wire.EngineVLLM}},
	{30000, []string{wire.EngineSGLang}},
	{8080, []string{wire.EngineLlamaCpp, wire.EngineMLX}},
	{11434, []string{wire.EngineOllama}},
}

// ErrNotEngine is returned by Detect for something that answers HTTP but
// is none of the engines heft knows.
var ErrNotEngine = errors.New("answers, but not like any engine heft knows")

// Detect tells which kind of engine serves baseURL, from the endpoints
// only that kind has: Ollama's /api/version, SGLang's /server_info,
// llama-server's /props, vLLM's /version, and mlx-lm's server last (it
// has nothing of its own: /v1/models and /health and a 404 for the rest).
// Each request is bounded by timeout.
func Detect(ctx context.Context, baseURL string, timeout time.Duration) (string, error) {
	// Any valid kind builds a client; only its plumbing is used here.
	c, err := New(Config{Kind: wire.EngineVLLM, URL: baseURL, Timeout: timeout}, nil)
	if err != nil {
		return "", err
	}
	var owned struct {
		Data []struct {
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	modelsErr := c.getJSON(ctx, "/v1/models", &owned)
	if errors.Is(modelsErr, errUnreachable) {
		return "", modelsErr
	}
	if modelsErr == nil && len(owned.Data) > 0 {
		switch owned.Data[0].OwnedBy {
		case "vllm":
			return wire.EngineVLLM, nil
		case "sglang":
			return wire.EngineSGLang, nil
		case "llamacpp":
			return wire.EngineLlamaCpp, nil
		}
	}
	probes := []struct {
		kind, path string
		fits       func(map[string]json.RawMessage) bool
	}{
		{wire.EngineOllama, "/api/version", has("version")},
		{wire.EngineSGLang, "/server_info", has("tp_size", "model_path")},
		{wire.EngineSGLang, "/get_server_info", has("tp_size", "model_path")},
		{wire.EngineLlamaCpp, "/props", has("default_generation_settings", "total_slots")},
		{wire.EngineVLLM, "/version", has("version")},
	}
	for _, p := range probes {
		var obj map[string]json.RawMessage
		err := c.getJSON(ctx, p.path, &obj)
		if errors.Is(err, errUnreachable) {
			return "", err
		}
		if err == nil && p.fits(obj) {
			return p.kind, nil
		}
	}
	if modelsErr == nil {
		var health map[string]json.RawMessage
		if err := c.getJSON(ctx, "/health", &health); err == nil && string(health["status"]) == `"ok"` {
			return wire.EngineMLX, nil
		}
	}
	return "", fmt.Errorf("%s %w", baseURL, ErrNotEngine)
}

func has(keys ...string) func(map[string]json.RawMessage) bool {
	return func(m map[string]json.RawMessage) bool {
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				return false
			}
		}
		return true
	}
}

// PortOpen reports whether something accepts TCP connections at the
// URL's host and port within timeout: a cheap check before Detect.
func PortOpen(ctx context.Context, rawURL string, timeout time.Duration) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return false
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}
