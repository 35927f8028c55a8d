package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"heft/shared/backoff"
)

// errNoModel is returned when the engine is up but serves no model.
var errNoModel = errors.New("engine lists no models in /v1/models")

// waitReady polls the engine until /health answers 200 (or 404: Ollama has
// no /health) and /v1/models lists a model, and returns the model to use:
// want when set, else the first one listed. It gives up after timeout with
// the last reason the engine was not ready. onWait hears each reason and
// how long the wait may still last.
func waitReady(ctx context.Context, client *http.Client, base, want string, timeout time.Duration, onWait func(why error, left time.Duration)) (string, error) {
	deadline := time.Now().Add(timeout)
	b := &backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		model, err := checkReady(ctx, client, base, want, time.Until(deadline))
		if err == nil {
			return model, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		left := time.Until(deadline)
		if onWait != nil {
			onWait(err, left)
		}
		if left <= 0 {
			return "", fmt.Errorf("engine at %s did not become ready within %v: %w", base, timeout, err)
		}
		if !b.Sleep(ctx, min(b.Next(), left)) {
			return "", ctx.Err()
		}
	}
}

func checkReady(ctx context.Context, client *http.Client, base, want string, left time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, min(max(left, 10*time.Millisecond), 5*time.Second))
	defer cancel()
	status, body, err := get(ctx, client, base+"/health")
	if err != nil {
		return "", err
	}
	if status != http.StatusOK && status != http.StatusNotFound {
		return "", fmt.Errorf("GET /health: %d %s: %s", status, http.StatusText(status), clip(strings.TrimSpace(string(body))))
	}
	status, body, err = get(ctx, client, base+"/v1/models")
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return "", fmt.Errorf("GET /v1/models: %d %s: %s", status, http.StatusText(status), clip(strings.TrimSpace(string(body))))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("GET /v1/models: not a model list: %v", err)
	}
	if want != "" {
		return want, nil
	}
	for _, m := range list.Data {
		if m.ID != "" {
			return m.ID, nil
		}
	}
	return "", errNoModel
}

// get fetches a small JSON document, reading at most 1 MiB of it.
func get(ctx context.Context, client *http.Client, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return resp.StatusCode, body, nil
}
