package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
)

// errNotServed marks an endpoint the engine does not serve (404, 405,
// 501): a missing optional feature, not a fault.
var errNotServed = errors.New("endpoint not served")

// errUnreachable wraps transport failures: nothing answered at all.
var errUnreachable = errors.New("engine unreachable")

// statusError is a non-2xx answer other than "not served".
type statusError struct {
	path   string
	status int
	body   string
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("GET %s answered %d %s", e.path, e.status, http.StatusText(e.status))
	if e.body != "" {
		msg += ": " + e.body
	}
	return msg
}

// get fetches path from the engine with the client's timeout and returns
// the bounded body. Errors wrap errUnreachable (no answer), errNotServed
// (404/405/501) or are a *statusError.
func (c *Client) get(ctx context.Context, path, accept string) ([]byte, int, error) {
	if s := sharedIn(ctx); s != nil && sharedPaths[path] {
		return s.get(ctx, c, path, accept)
	}
	return c.fetch(ctx, path, accept)
}

// fetch is get without a shared reading.
func (c *Client) fetch(ctx context.Context, path, accept string) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: %w", path, err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("GET %s: %w: %s", path, errUnreachable, describeTransport(err, c.timeout))
	}
	defer resp.Body.Close()
	body, err := readBounded(resp.Body, MaxBodyBytes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, resp.StatusCode, fmt.Errorf("GET %s: %w: %s", path, errUnreachable, describeTransport(ctx.Err(), c.timeout))
		}
		return nil, resp.StatusCode, fmt.Errorf("GET %s: %w", path, err)
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return body, resp.StatusCode, nil
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed ||
		resp.StatusCode == http.StatusNotImplemented:
		return body, resp.StatusCode, fmt.Errorf("GET %s: %w (%d)", path, errNotServed, resp.StatusCode)
	default:
		return body, resp.StatusCode, &statusError{path: path, status: resp.StatusCode, body: snippet(body)}
	}
}

// getJSON fetches path and decodes a JSON answer into v.
func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	body, _, err := c.get(ctx, path, "application/json")
	if err != nil {
		return err
	}
	return decodeJSON(path, body, v)
}

func decodeJSON(path string, body []byte, v any) error {
	if looksLikeHTML(body) {
		return fmt.Errorf("GET %s answered HTML, not JSON", path)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s answered something that is not the expected JSON: %v", path, err)
	}
	return nil
}

// describeTransport turns a transport error into words an operator knows.
func describeTransport(err error, timeout time.Duration) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer within %s", timeout)
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "unknown host " + dnsErr.Name
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// snippet is the start of a body for an error message, on one line.
func snippet(body []byte) string {
	if looksLikeHTML(body) {
		return "(an HTML page)"
	}
	s := strings.Join(strings.Fields(string(body[:min(len(body), 200)])), " ")
	return strings.ToValidUTF8(s, "?")
}
