package nginx

import (
	"reflect"
	"testing"

	"heft/gateway/target"
)

func TestUpstreamServers(t *testing.T) {
	const file = `# the operator's starting file
upstream other { server 10.0.0.9:80; }
upstream qwen {
    least_conn;
    keepalive 32;  # to the engines
    server 10.0.0.1:8000 weight=3 max_fails=2;   # fast
    server "10.0.0.2:8000";
    server 10.0.0.3:8000 down;
    server 10.0.0.4:8000 backup;
    server engine-5.internal;
    server [fd00::6]:8000 weight=2;
    server unix:/run/engine.sock;
}
`
	got, err := upstreamServers(file, "qwen")
	if err != nil {
		t.Fatal(err)
	}
	want := []target.Served{
		{Address: "10.0.0.1:8000", Weight: 3, Owned: true},
		{Address: "10.0.0.2:8000", Weight: 1, Owned: true},
		{Address: "engine-5.internal:80", Weight: 1, Owned: true},
		{Address: "[fd00::6]:8000", Weight: 2, Owned: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// heft-sync's own rendering reads back as it was written.
	data, _, err := Render(Config{Upstream: "qwen", Directives: []string{"least_conn"}}, target.Model{Name: "m", Backends: []target.Backend{
		{Address: "10.0.0.1:8000", Scheme: "http", WorkerID: "w1", State: "admitted", Serving: true, Weight: 2},
		{Address: "10.0.0.2:8000", Scheme: "http", WorkerID: "w2", State: "admitted", Serving: true, Weight: 1},
		{Address: "10.0.0.3:8000", Scheme: "http", WorkerID: "w3", State: "held"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got, err = upstreamServers(string(data), "qwen")
	if err != nil || len(got) != 2 || got[0].Weight != 2*got[1].Weight {
		t.Fatalf("heft's own file read back as %+v, %v:\n%s", got, err, data)
	}
	for _, bad := range []string{
		"upstream other { server 10.0.0.1:80; }",
		"upstream qwen { server 10.0.0.1:80; ",
		"upstream qwen { server 10.0.0.1:80 }",
		"}",
	} {
		if got, err := upstreamServers(bad, "qwen"); err == nil {
			t.Errorf("%q: %+v, want an error", bad, got)
		}
	}
}

func FuzzUpstreamServers(f *testing.F) {
	f.Add("upstream qwen { server 10.0.0.1:8000 weight=3; server b down; }")
	f.Add(`upstream qwen { server "a:1" 'x' # c
	; }`)
	f.Fuzz(func(t *testing.T, text string) {
		got, err := upstreamServers(text, "qwen")
		if err != nil {
			return
		}
		for _, s := range got {
			if !(s.Weight >= 1) || s.Address == "" {
				t.Fatalf("%q: read %+v", text, s)
			}
		}
	})
}
