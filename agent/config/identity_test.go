package config

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
)

// One engine's socket spelled every way an operator writes it is one
// identity; other ports, paths and hosts are not.
func TestEngineID(t *testing.T) {
	same := [][]string{
		{"http://localhost:8000", "http://127.0.0.1:8000", "http://[::1]:8000", "http://LOCALHOST:8000/", "http://127.0.0.1:8000/v1",
			"http://0.0.0.0:8000", "HTTP://localhost.:8000//", "http://127.0.0.1:08000"},
		{"http://gpu-a:80", "http://GPU-A", "http://gpu-a/"},
		{"https://gpu-a", "https://gpu-a:443/v1/"},
		{"http://[::ffff:10.0.0.5]:8000", "http://10.0.0.5:8000", "http://10.0.0.5:8000/"},
		{"http://[2001:db8::0:1]:8000", "http://[2001:DB8::1]:8000"},
		{"http://10.0.0.5:8000/engine-a", "http://10.0.0.5:8000/engine-a/v1/"},
	}
	var firsts []string
	for _, group := range same {
		for _, u := range group[1:] {
			if EngineID(u) != EngineID(group[0]) {
				t.Errorf("EngineID(%q) = %q, EngineID(%q) = %q: one engine", u, EngineID(u), group[0], EngineID(group[0]))
			}
		}
		firsts = append(firsts, EngineID(group[0]))
	}
	firsts = append(firsts, EngineID("http://localhost:8001"), EngineID("http://gpu-a:81"), EngineID("http://10.0.0.5:8000/engine-b"))
	distinct := slices.Clone(firsts)
	slices.Sort(distinct)
	if len(slices.Compact(distinct)) != len(firsts) {
		t.Errorf("distinct engines share an identity: %q", firsts)
	}
}

// A host name resolved is one with its addresses: a name that reaches this
// host is localhost's engine, a remote name the engine at its address. A
// failed lookup keeps the name, and addresses and local names are never
// looked up.
func TestEngineSockets(t *testing.T) {
	var asked []string
	lookup := func(_ context.Context, host string) ([]net.IPAddr, error) {
		asked = append(asked, host)
		switch host {
		case "engine.test":
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}}, nil
		case "gpu-a.test":
			return []net.IPAddr{{IP: net.ParseIP("10.0.0.7")}, {IP: net.ParseIP("10.0.0.5")}}, nil
		}
		return nil, errors.New("no such host")
	}
	ctx := t.Context()
	shares := func(a, b string) bool {
		bs := EngineSockets(ctx, b, lookup)
		return slices.ContainsFunc(EngineSockets(ctx, a, lookup), func(id string) bool { return slices.Contains(bs, id) })
	}
	for _, pair := range [][2]string{
		{"http://engine.test:8000", "http://localhost:8000/"},
		{"http://gpu-a.test:8000", "http://10.0.0.5:8000"},
		{"http://gpu-a.test:8000/v1", "http://[::ffff:10.0.0.7]:8000"},
		{"http://unknown.test:8000", "http://UNKNOWN.test:8000/"},
	} {
		if !shares(pair[0], pair[1]) {
			t.Errorf("%s and %s: no shared socket (%q, %q)", pair[0], pair[1], EngineSockets(ctx, pair[0], lookup), EngineSockets(ctx, pair[1], lookup))
		}
	}
	for _, pair := range [][2]string{
		{"http://engine.test:8000", "http://localhost:8001"},
		{"http://gpu-a.test:8000", "http://10.0.0.6:8000"},
		{"http://unknown.test:8000", "http://10.0.0.5:8000"},
	} {
		if shares(pair[0], pair[1]) {
			t.Errorf("%s and %s share a socket", pair[0], pair[1])
		}
	}
	if got := EngineSockets(ctx, "http://engine.test:8000", nil); !slices.Equal(got, []string{EngineID("http://engine.test:8000")}) {
		t.Errorf("without a lookup: %q", got)
	}
	for _, h := range asked {
		if !strings.HasSuffix(h, ".test") {
			t.Errorf("looked up %q: addresses and this host's names need no lookup", h)
		}
	}
}

// Config refuses one engine written twice, however it is spelled.
func TestValidateRefusesOneEngineTwice(t *testing.T) {
	c := Default()
	c.Coordinator.URL, c.Coordinator.Token = "ws://127.0.0.1:7070/api/v1/agent", "t"
	c.Engines = []Engine{{Kind: "vllm", URL: "http://localhost:8000"}, {Kind: "sglang", URL: "http://127.0.0.1:30000"},
		{Kind: "vllm", URL: "http://127.0.0.1:8000/"}}
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "engine 3: http://127.0.0.1:8000/ is the engine of engine 1 (http://localhost:8000)") {
		t.Fatalf("err = %v; want engine 3 refused as engine 1's", err)
	}
	c.Engines[2].URL = "http://127.0.0.1:8001"
	if err := c.Validate(); err != nil {
		t.Fatalf("two engines on two ports: %v", err)
	}
}
