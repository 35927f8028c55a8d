package nginx

import (
	"testing"

	"heft/gateway/target"
)

// The worker nginx -t names is found by the line it points at, or by the
// host it could not resolve; a line that is not a worker's (a directive,
// another file) names none, and the whole file is refused as before.
func TestRefusedBackend(t *testing.T) {
	const file = "/etc/nginx/heft/qwen.conf"
	m := target.Model{Name: "m", Backends: []target.Backend{{Address: "10.0.0.1:80", WorkerID: "a"}, {Address: "bad.invalid:80", WorkerID: "b"}}}
	data := []byte("# heft\nupstream q {\n    least_conn;\n    server 10.0.0.1:80 weight=1;  # a\n    server bad.invalid:80 weight=1;  # b\n}\n")
	for _, c := range []struct {
		msg, want string
	}{
		{`nginx: [emerg] host not found in upstream "bad.invalid:80" in /etc/nginx/heft/qwen.conf:5`, "b"},
		{`nginx: [emerg] something about line 4 in /etc/nginx/heft/qwen.conf:4`, "a"},
		{`nginx: [emerg] host not found in upstream "bad.invalid:80"`, "b"},
		{`nginx: [emerg] unknown directive "least_conn" in /etc/nginx/heft/qwen.conf:3`, ""},
		{`nginx: [emerg] host not found in upstream "qwen" in /etc/nginx/nginx.conf:17`, ""},
		{`nginx: [emerg] host not found in upstream "bad.invalid:80" in /etc/nginx/nginx.conf:17`, ""},
		{`nginx: [emerg] in /etc/nginx/heft/qwen.conf:99`, ""},
		{`exit status 1`, ""},
	} {
		b, ok := refusedBackend(c.msg, file, data, m)
		if ok != (c.want != "") || b.WorkerID != c.want {
			t.Errorf("%q: %q %v, want %q", c.msg, b.WorkerID, ok, c.want)
		}
	}
}

// Only a worker nginx serves now (in the last good file, neither down nor
// backup) whose name nginx cannot resolve keeps the last good file.
func TestServedUnresolved(t *testing.T) {
	const msg = `nginx: [emerg] host not found in upstream "b.test:80"`
	b := target.Backend{Address: "b.test:80", WorkerID: "b", Serving: true}
	for _, c := range []struct {
		msg, old string
		want     bool
	}{
		{msg, "upstream q { server 10.0.0.1:80; server b.test:80 weight=3; }", true},
		{msg, "upstream q { server 10.0.0.1:80; server b.test; }", true}, // nginx's default port
		{msg, "upstream q { server 10.0.0.1:80; server B.TEST:80; }", true},
		{msg, "upstream q { server 10.0.0.1:80; }", false}, // new: left out as before
		{msg, "upstream q { server 10.0.0.1:80; server b.test:80 down; }", false},
		{msg, "upstream q { server 10.0.0.1:80; server b.test:80 backup; }", false},
		{msg, "upstream other { server b.test:80; }", false},
		{msg, "", false}, // no file before
		{`nginx: [emerg] invalid parameter "x" in /f.conf:3`, "upstream q { server b.test:80; }", false},
	} {
		var old []byte
		if c.old != "" {
			old = []byte(c.old)
		}
		if got := servedUnresolved(c.msg, old, "q", b); got != c.want {
			t.Errorf("%q with %q: %v, want %v", c.msg, c.old, got, c.want)
		}
	}
	// A worker the coordinator no longer serves (held, offline: written
	// down) is not worth the upstream: a retired host whose DNS record was
	// deleted would otherwise freeze every later change until the
	// coordinator forgets it. It is left out, as it is to be drained.
	drained := b
	drained.Serving = false
	if servedUnresolved(msg, []byte("upstream q { server 10.0.0.1:80; server b.test:80 weight=3; }"), "q", drained) {
		t.Error("a drained worker whose name does not resolve kept the last good file")
	}
}
