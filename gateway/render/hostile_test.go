package render_test

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"heft/gateway/gwtest"
	"heft/gateway/render"
	"heft/gateway/target"
	"heft/shared/view"
)

// hostileStrings are what a host holding the enrolment token can say as a
// capacity key (a worker ID), a state or a model name: each was, or is
// shaped like, a line that became gateway configuration.
var hostileStrings = []string{
	"gpu-a/k\n    server 127.0.0.1:1 weight=100;",               // an nginx server line (served /etc/passwd)
	"gpu-a/k\nlisten evil\n    bind 127.0.0.1:1\n    mode http", // an HAProxy section that passed haproxy -c
	"gpu-a/k\r\n    server x 127.0.0.1:1",
	"gpu-a/k\ngeneral_settings:\n  master_key: sk-evil", // LiteLLM's master key
	"k;}\nserver{listen 127.0.0.1:2;location /{root /;}}\nupstream x{",
	"k # comment", `k"quoted'`, "k{}", "k;", "k\\", "k\x00nul", "k\x1b[31mred", "k\tc",
	"k\u2028listen x", "k\u2029listen x", "k\u0085listen x", "k\u202etxt.exe", "k\ufeff", "\xff\xfe",
	"", strings.Repeat("k", 5000), "$(reboot)", "os.environ/LITELLM_MASTER_KEY",
	"\n", "\n\n", "\r", // yaml.v3 alone writes "\n" as a block that reads back as ""
}

// hostileAddresses are advertised addresses no gateway may be given.
var hostileAddresses = []string{
	"unix:80", "UNIX:80", "unix:/tmp/s:80", "http://unix:80", "127.0.0.1:80\n    server 127.0.0.1:2",
	"evil\nserver x:80", "host:port\nserver evil", "[::1]:x", "", strings.Repeat("a", 300) + ":80",
	"a b:80", "a;b:80", "a{b}:80", "a#b:80", `"a":80`, "a'b:80", "a\tb:80", "a\x00:80", "a\r:80",
	"a:0", "a:65536", "a:-1", "a:+80", "a:080000", "a:", ":80", "a", "[fe80::1%eth0]:80",
	"0.0.0.0:80", "[::]:80", "224.0.0.1:80", "255.255.255.255:80", "2130706433:80", "0x7f.1:80",
	"::1:80", "[10.0.0.1]:80", "a..b:80", ".a:80", "-a:80", "a-:80", "a_b.c-d.\u0430:80", "a/b:80",
	"a\u2028b:80", "a$b:80",
}

// goodAddresses are taken as they are.
var goodAddresses = []string{"10.0.0.1:8000", "[fd00::7]:8000", "gpu-a.example:8000", "node_1:80", "localhost:8000", "[::ffff:10.0.0.1]:80"}

// hostileModel is a model whose every worker carries a hostile string or
// address, plus two good workers (one serving, one held).
func hostileModel(name string) target.Model {
	m := target.Model{Name: name, Backends: []target.Backend{
		{Address: "10.0.0.1:8000", Scheme: "http", WorkerID: "good-a", State: view.StateAdmitted, Serving: true, Weight: 1.5, MaxConcurrency: 8},
		{Address: "10.0.0.2:8000", Scheme: "http", WorkerID: "good-b", State: view.StateHeld},
	}}
	for i, s := range hostileStrings {
		m.Backends = append(m.Backends, target.Backend{Address: fmt.Sprintf("10.1.0.%d:8000", i+1), Scheme: "http",
			WorkerID: s, Node: s, State: s, Serving: i%2 == 0, Weight: 1})
	}
	for _, a := range hostileAddresses {
		m.Backends = append(m.Backends, target.Backend{Address: a, Scheme: "http", WorkerID: "w-" + a, State: view.StateAdmitted, Serving: true, Weight: 1})
	}
	return m
}

func TestCheckAddressCorpus(t *testing.T) {
	for _, a := range hostileAddresses {
		if err := target.CheckAddress(a); err == nil {
			t.Errorf("CheckAddress(%q) took it", a)
		}
	}
	for _, a := range goodAddresses {
		if err := target.CheckAddress(a); err != nil {
			t.Errorf("CheckAddress(%q): %v", a, err)
		}
	}
}

// want is the set of addresses a rendering must hold: the workers
// target.Clean keeps, and for LiteLLM only the serving ones.
func want(m target.Model, servingOnly bool) []string {
	clean, _ := target.Clean(m)
	var out []string
	for _, b := range clean.Backends {
		if b.Serving || !servingOnly {
			out = append(out, b.Address)
		}
	}
	slices.Sort(out)
	return out
}

var (
	nginxServer   = regexp.MustCompile(`^    server (\S+) (weight=[1-9][0-9]*( max_conns=[1-9][0-9]*)?|down); *# [ -~]*$`)
	haproxyServer = regexp.MustCompile(`^    server heft-[A-Za-z0-9._-]+ (\S+)( ssl verify required ca-file @system-ca)? weight [1-9][0-9]*` +
		`( maxconn [1-9][0-9]*)? check inter 2s fall 2 rise 2( disabled)?( agent-check agent-addr [0-9a-f.:]+ agent-port [0-9]+ agent-inter [0-9a-z]+ agent-send "[!-~]+ \S+\\n")?  # [ -~]*$`)
)

// checkNginx reads an upstream file back line by line: comments, the
// upstream line, the directives, one server line per worker, the closing
// brace, nothing else; and the servers are exactly the workers wanted.
func checkNginx(out []byte, upstream string, directives []string, wantAddrs []string) error {
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	var got []string
	i := 0
	for i < len(lines) && strings.HasPrefix(lines[i], "# ") && printableASCII(lines[i]) {
		i++
	}
	if i >= len(lines) || lines[i] != "upstream "+upstream+" {" {
		return fmt.Errorf("line %d is not the upstream line: %q", i+1, lines[min(i, len(lines)-1)])
	}
	i++
	for _, d := range directives {
		if i >= len(lines) || lines[i] != "    "+d+";" {
			return fmt.Errorf("line %d is not directive %q", i+1, d)
		}
		i++
	}
	for ; i < len(lines)-1; i++ {
		sm := nginxServer.FindStringSubmatch(lines[i])
		if sm == nil {
			return fmt.Errorf("line %d is not a server line: %q", i+1, lines[i])
		}
		got = append(got, sm[1])
	}
	if lines[len(lines)-1] != "}" {
		return fmt.Errorf("the last line is not '}': %q", lines[len(lines)-1])
	}
	return sameAddrs(got, wantAddrs)
}

// checkHAProxy reads server lines back: the health check's httpchk line
// first, then its "timeout check", then one server line per worker,
// nothing else.
func checkHAProxy(out []byte, wantAddrs []string) error {
	if len(out) == 0 {
		return sameAddrs(nil, wantAddrs)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	n := 0
	if l := lines[0]; l == "    option httpchk GET /health" || l == "    option httpchk GET /api/version" {
		n++
	}
	if n >= len(lines) || lines[n] != "    timeout check 5s" {
		return fmt.Errorf("no \"timeout check 5s\" line before the servers")
	}
	n++
	var got []string
	for i, l := range lines[n:] {
		sm := haproxyServer.FindStringSubmatch(l)
		if sm == nil {
			return fmt.Errorf("line %d is not a server line: %q", n+i+1, l)
		}
		got = append(got, sm[1])
	}
	return sameAddrs(got, wantAddrs)
}

// checkModelList reads a model_list back with a YAML parser: one
// top-level key, each deployment exactly the fields heft writes, and
// their api_base the workers wanted.
func checkModelList(out []byte, modelName string, wantAddrs []string) error {
	var top map[string]any
	if err := yaml.Unmarshal(out, &top); err != nil {
		return fmt.Errorf("not YAML: %v", err)
	}
	if len(top) != 1 || top["model_list"] == nil {
		return fmt.Errorf("top-level keys %v, want only model_list", keys(top))
	}
	var doc struct {
		ModelList []render.Deployment `yaml:"model_list"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("a deployment has a field heft does not write: %v", err)
	}
	var got []string
	for _, d := range doc.ModelList {
		if d.ModelName != modelName {
			return fmt.Errorf("model_name %q, want %q", d.ModelName, modelName)
		}
		if w := float64(d.LiteLLMParams.Weight); math.IsNaN(w) || math.IsInf(w, 0) || w <= 0 {
			return fmt.Errorf("weight %g", w)
		}
		addr, ok := strings.CutSuffix(strings.TrimPrefix(strings.TrimPrefix(d.LiteLLMParams.APIBase, "http://"), "https://"), "/v1")
		if !ok {
			return fmt.Errorf("api_base %q", d.LiteLLMParams.APIBase)
		}
		got = append(got, addr)
	}
	return sameAddrs(got, wantAddrs)
}

func sameAddrs(got, want []string) error {
	got = slices.Clone(got)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("servers %q, want exactly %q", got, want)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The hostile corpus renders to a file nginx -t takes, holding the good
// workers and the hostile-named ones at good addresses, and nothing else.
func TestNginxUpstreamHostileCorpus(t *testing.T) {
	for _, name := range append([]string{model}, hostileStrings...) {
		m := hostileModel(name)
		out, _, err := render.NginxUpstream(render.Nginx{Upstream: "qwen", Directives: []string{"least_conn"}}, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkNginx(out, "qwen", []string{"least_conn"}, want(m, false)); err != nil {
			t.Fatalf("model %q: %v\n%s", name, err, out)
		}
	}
	out, _, _ := render.NginxUpstream(render.Nginx{Upstream: "qwen"}, hostileModel(hostileStrings[0]))
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://qwen; } }", string(out))

	for _, bad := range []render.Nginx{{Upstream: "q\nserver x"}, {Upstream: ""}, {Upstream: "q", Directives: []string{"least_conn;\nserver x"}},
		{Upstream: "q", Directives: []string{"hash \"x"}}, {Upstream: "q", Directives: []string{"a}"}}} {
		if _, _, err := render.NginxUpstream(bad, hostileModel(model)); err == nil {
			t.Errorf("%+v rendered", bad)
		}
	}
}

// The same for HAProxy's server lines, haproxy -c included: no worker
// string opens a section or a server of its own.
func TestHAProxyHostileCorpus(t *testing.T) {
	for _, name := range append([]string{model}, hostileStrings...) {
		m := hostileModel(name)
		out, _, err := render.HAProxy(m, render.HAProxyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := checkHAProxy(out, want(m, false)); err != nil {
			t.Fatalf("model %q: %v\n%s", name, err, out)
		}
		out, _, err = render.HAProxy(m, render.HAProxyOptions{AgentCheck: "10.0.0.100:7071"})
		if render.AgentSendable(name) != (err == nil) {
			t.Fatalf("model %q with an agent check: %v", name, err)
		}
		if err == nil {
			if err := checkHAProxy(out, want(m, false)); err != nil {
				t.Fatalf("model %q with an agent check: %v\n%s", name, err, out)
			}
		}
	}
	out, _, _ := render.HAProxy(hostileModel(model), render.HAProxyOptions{})
	cfg := "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n" +
		"frontend llm\n    bind 127.0.0.1:9\n    default_backend qwen\nbackend qwen\n    balance leastconn\n" + string(out)
	gwtest.CheckHAProxyConfig(t, cfg)
	if n := strings.Count(cfg, "\nlisten ") + strings.Count(cfg, "\nfrontend ") + strings.Count(cfg, "\nbackend "); n != 2 {
		t.Fatalf("%d sections, want 2:\n%s", n, cfg)
	}

	for _, opt := range []render.HAProxyOptions{{AgentCheck: "10.0.0.1:7071\nlisten x"}, {AgentCheck: "unix:7071"},
		{AgentCheck: "10.0.0.1:7071", AgentInter: "2s\nlisten x"}, {AgentCheck: "10.0.0.1:7071", AgentTokenEnv: "X} \"\nlisten x"},
		{AgentCheck: "10.0.0.1:7071", AgentTokenEnv: "1TOKEN"}} {
		if _, _, err := render.HAProxy(hostileModel(model), opt); err == nil {
			t.Errorf("%+v rendered", opt)
		}
	}
}

// LiteLLM's model_list holds one top-level key and the serving workers
// at good addresses, whatever the names.
func TestModelListHostileCorpus(t *testing.T) {
	for _, name := range append([]string{model}, hostileStrings...) {
		m := hostileModel(name)
		ds, _ := render.Deployments(render.LiteLLM{}, m)
		out, err := render.ModelList(ds)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkModelList(out, name, want(m, true)); err != nil {
			t.Fatalf("model %q: %v\n%s", name, err, out)
		}
	}
}

// fuzzModel is one good serving worker and one made of the fuzzer's
// strings.
func fuzzModel(name, id, state, addr string, weight float64, maxConc int, serving bool) target.Model {
	return target.Model{Name: name, Backends: []target.Backend{
		{Address: "10.0.0.1:8000", Scheme: "http", WorkerID: "good", State: view.StateAdmitted, Serving: true, Weight: 1.5},
		{Address: addr, Scheme: "http", WorkerID: id, State: state, Serving: serving, Weight: weight, MaxConcurrency: maxConc},
	}}
}

func addFuzzSeeds(f *testing.F) {
	for i, s := range hostileStrings {
		f.Add(s, s, s, "10.0.0.2:8000", 1.0, 4, i%2 == 0)
	}
	for _, a := range append(hostileAddresses, goodAddresses...) {
		f.Add(model, "w", view.StateAdmitted, a, 2.0, -1, true)
	}
	f.Add(model, "w", view.StateAdmitted, "10.0.0.2:8000", math.Inf(1), 1<<40, true)
	f.Add(model, "w", view.StateAdmitted, "10.0.0.2:8000", math.NaN(), 0, true)
	f.Add(model, "w", view.StateAdmitted, "10.0.0.1:8000", 1.0, 0, true) // a second worker at one address
}

// Property: the upstream file parses and holds exactly the workers given
// that a gateway may be given, nothing else.
func FuzzNginxUpstream(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, name, id, state, addr string, weight float64, maxConc int, serving bool) {
		m := fuzzModel(name, id, state, addr, weight, maxConc, serving)
		out, _, err := render.NginxUpstream(render.Nginx{Upstream: "qwen", Directives: []string{"least_conn"}, MaxConns: true}, m)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkNginx(out, "qwen", []string{"least_conn"}, want(m, false)); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	})
}

// Property: the server lines parse and are exactly the workers given.
func FuzzHAProxy(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, name, id, state, addr string, weight float64, maxConc int, serving bool) {
		m := fuzzModel(name, id, state, addr, weight, maxConc, serving)
		for _, opt := range []render.HAProxyOptions{{}, {AgentCheck: "10.0.0.100:7071"}} {
			out, _, err := render.HAProxy(m, opt)
			if err != nil {
				if opt.AgentCheck != "" && !render.AgentSendable(name) {
					continue
				}
				t.Fatal(err)
			}
			if err := checkHAProxy(out, want(m, false)); err != nil {
				t.Fatalf("%+v: %v\n%s", opt, err, out)
			}
		}
	})
}

// Property: model_list parses with one top-level key and is exactly the
// serving workers given.
func FuzzModelList(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, name, id, state, addr string, weight float64, maxConc int, serving bool) {
		m := fuzzModel(name, id, state, addr, weight, maxConc, serving)
		ds, _ := render.Deployments(render.LiteLLM{}, m)
		out, err := render.ModelList(ds)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkModelList(out, name, want(m, true)); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	})
}
