package address

import (
	"strings"
	"testing"
)

func TestIsLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "[::1]": true, "localhost": true, "LocalHost": true,
		"localhost.": true, "gpu-a.localhost": true, // RFC 6761: every name under .localhost is loopback
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "coord.example": false, "localhost.example": false,
		"notlocalhost": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %t, want %t", host, got, want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	for _, ok := range []string{"ws://127.0.0.1:7070/api/v1/agent", "wss://coord.example/api/v1/agent", "https://[::1]:8443/x"} {
		if _, err := CheckURL("coordinator URL", ok, "ws", "wss", "http", "https"); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, tc := range []struct{ raw, want string }{
		{"", "coordinator URL is empty: want ws:// or wss://"},
		{"coord:7070", `coordinator URL "coord:7070" has no scheme: want ws:// or wss://, e.g. ws://coord:7070`},
		{"tcp://h:1", `coordinator URL "tcp://h:1": scheme must be ws:// or wss://`},
		{"ws:///api", "has no host"},
		{"ws://%zz", `coordinator URL "ws://%zz": parse`},
		{"ws://h:99999/", "port 99999 is not 1..65535"},
		{"ws://u:p@h/", "must not carry credentials"},
		{"ws://h/?token=x", "a query"},
	} {
		_, err := CheckURL("coordinator URL", tc.raw, "ws", "wss")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one containing %q", tc.raw, err, tc.want)
		}
	}
}

func TestHostPort(t *testing.T) {
	for raw, want := range map[string]string{
		"http://10.0.0.5:8000": "10.0.0.5:8000", "http://gpu-a.example": "gpu-a.example:80",
		"https://gpu-a.example/v1": "gpu-a.example:443", "http://[fd00::5]:8000/": "[fd00::5]:8000",
		" http://h:1 ": "h:1",
	} {
		if got, err := HostPort(raw); err != nil || got != want {
			t.Errorf("HostPort(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.5:8000", "ftp://h", "http://%zz"} {
		if got, err := HostPort(bad); err == nil {
			t.Errorf("HostPort(%q) = %q, want an error", bad, got)
		}
	}
}

// What people type for a coordinator: its address, or the dashboard's
// URL. Each becomes the agent endpoint, and the note says how.
func TestWebsocketURL(t *testing.T) {
	for _, tc := range []struct{ raw, want, note string }{
		{"ws://coord:7070/api/v1/agent", "ws://coord:7070/api/v1/agent", ""},
		{"wss://coord.example/proxy/heft/api/v1/agent", "wss://coord.example/proxy/heft/api/v1/agent", ""},
		{"ws://coord:7070", "ws://coord:7070/api/v1/agent", "coordinator URL ws://coord:7070: path /api/v1/agent added; dialling ws://coord:7070/api/v1/agent"},
		{"ws://coord:7070/", "ws://coord:7070/api/v1/agent", "path /api/v1/agent added"},
		{"http://10.0.0.5:7070", "ws://10.0.0.5:7070/api/v1/agent", "scheme http:// becomes ws://, path /api/v1/agent added"},
		{"https://coord.example/api/v1/agent", "wss://coord.example/api/v1/agent", "scheme https:// becomes wss://; dialling wss://coord.example/api/v1/agent"},
		{" ws://[::1]:7070 ", "ws://[::1]:7070/api/v1/agent", "path /api/v1/agent added"},
	} {
		got, note, err := WebsocketURL("coordinator URL", tc.raw, "/api/v1/agent")
		if err != nil || got != tc.want || !strings.Contains(note, tc.note) || (tc.note == "") != (note == "") {
			t.Errorf("%q: %q, note %q, %v; want %q, note with %q", tc.raw, got, note, err, tc.want, tc.note)
		}
	}
	for _, tc := range []struct{ raw, want string }{
		{"coord:7070", "has no scheme: want ws:// or wss:// or http:// or https://, e.g. ws://coord:7070"},
		{"ftp://coord:7070", "scheme must be"},
		{"ws://coord:7070/?token=x", "a query"},
	} {
		if _, _, err := WebsocketURL("coordinator URL", tc.raw, "/api/v1/agent"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one containing %q", tc.raw, err, tc.want)
		}
	}
}
