package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// ErrNotEngine is returned by Detect for something that answers HTTP but
// is none of the engines heft knows.
var ErrNotEngine = errors.New("answers, but not like any engine heft knows")

// Detect tells which kind of engine serves baseURL: by the owned_by of
// its /v1/models, else by the endpoints only that kind has (each kind's
// detection, in registry order), else as the kind that has nothing of its
// own (mlx-lm: /v1/models, a /health object and 404 for the rest). Each
// request is bounded by timeout.
func Detect(ctx context.Context, baseURL string, timeout time.Duration) (string, error) {
	// Any valid kind builds a client; only its plumbing is used here.
	c, err := New(Config{Kind: registry[0].name, URL: baseURL, Timeout: timeout}, nil)
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
		for _, d := range registry {
			if d.detect.ownedBy != "" && d.detect.ownedBy == owned.Data[0].OwnedBy {
				return d.name, nil
			}
		}
	}
	for _, d := range registry {
		for _, p := range d.detect.probes {
			var obj map[string]json.RawMessage
			err := c.getJSON(ctx, p.path, &obj)
			if errors.Is(err, errUnreachable) {
				return "", err
			}
			if err == nil && fits(obj, p.keys) {
				return d.name, nil
			}
		}
	}
	if modelsErr == nil {
		for _, d := range registry {
			if !d.detect.fallback {
				continue
			}
			var health map[string]json.RawMessage
			if err := c.getJSON(ctx, d.health, &health); err == nil && string(health["status"]) == `"ok"` {
				return d.name, nil
			}
		}
	}
	return "", fmt.Errorf("%s %w", baseURL, ErrNotEngine)
}

// fits reports whether a JSON object holds every key.
func fits(obj map[string]json.RawMessage, keys []string) bool {
	for _, k := range keys {
		if _, ok := obj[k]; !ok {
			return false
		}
	}
	return true
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
