package render_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"heft/gateway/coord"
	"heft/gateway/gwtest"
	"heft/gateway/render"
	"heft/gateway/target"
	"heft/shared/view"
)

const model = "Qwen/Qwen3-8B"

// fleet is the fleet: two admitted workers (1.37 and 0.63, caps
// 22 and 16), one held for uneven pools, one offline, one measuring; and
// any extra workers.
func fleet(extra ...coord.Worker) target.Model {
	fast := gwtest.Worker(model, "10.0.0.1:8000", view.StateAdmitted, 1.37)
	slow := gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 0.63)
	c22, c16 := 22, 16
	fast.MaxConcurrency, slow.MaxConcurrency = &c22, &c16
	held := gwtest.Worker(model, "10.0.0.3:8000", view.StateHeld, 0)
	held.MaxConcurrency = &c16
	m, _ := target.ForModel(model, append(extra, slow, held, fast,
		gwtest.Worker(model, "10.0.0.4:8000", view.StateOffline, 0),
		gwtest.Worker(model, "10.0.0.5:8000", view.StateMeasuring, 0),
		gwtest.Worker("other", "10.0.0.9:8000", view.StateAdmitted, 1)))
	return m
}

func TestHAProxyParses(t *testing.T) {
	// An engine served over TLS, and one at an IPv6 address, parse too.
	tls := gwtest.Worker(model, "10.0.0.6:8443", view.StateAdmitted, 1)
	tls.URL = "https://10.0.0.6:8443"
	v6 := gwtest.Worker(model, "[fd00::7]:8000", view.StateAdmitted, 1)
	lines, rounding, err := render.HAProxy(fleet(tls, v6), render.HAProxyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	text := string(lines)
	if !strings.HasPrefix(text, "    option httpchk GET /health\n    timeout check 5s\n") {
		t.Errorf("the engines' health check and its timeout do not come first:\n%s", text)
	}
	for _, want := range []string{
		"    server heft-10.0.0.1-8000 10.0.0.1:8000 weight 137 maxconn 22 check inter 2s fall 2 rise 2  # admitted, weight 1.37, w-10.0.0.1:8000\n",
		"    server heft-10.0.0.2-8000 10.0.0.2:8000 weight 63 maxconn 16 check inter 2s fall 2 rise 2  # admitted, weight 0.63, w-10.0.0.2:8000\n",
		"    server heft-10.0.0.3-8000 10.0.0.3:8000 weight 1 maxconn 16 check inter 2s fall 2 rise 2 disabled  # held, w-10.0.0.3:8000\n",
		"    server heft-10.0.0.4-8000 10.0.0.4:8000 weight 1 check inter 2s fall 2 rise 2 disabled  # offline",
		"    server heft-10.0.0.5-8000 10.0.0.5:8000 weight 1 check inter 2s fall 2 rise 2 disabled  # measuring",
		"    server heft-10.0.0.6-8443 10.0.0.6:8443 ssl verify required ca-file @system-ca weight 100 check inter 2s fall 2 rise 2  #",
		"    server heft-fd00--7-8000 [fd00::7]:8000 weight 100 check inter 2s fall 2 rise 2  #",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
	// Heaviest first, then the drained ones; no other model's worker.
	if i, j := strings.Index(text, "10.0.0.1:8000"), strings.Index(text, "10.0.0.2:8000"); i > j || strings.Contains(text, "10.0.0.9") {
		t.Errorf("order or model wrong:\n%s", text)
	}
	if rounding != 0 {
		t.Errorf("rounding error %g, want 0 (137/63 is exact)", rounding)
	}
	gwtest.CheckHAProxyConfig(t, `defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
frontend llm
    bind 127.0.0.1:9
    default_backend qwen
backend qwen
    balance leastconn
    option http-no-delay
`+text)
}

// The rendered backend keeps an engine in it while the engine's /health
// answers late (3 s, more than the check's inter 2s) and it serves:
// HAProxy's health check, with the rendered "timeout check", passes, and
// requests through the backend are answered. Without "timeout check"
// HAProxy gives the whole check inter (2 s), and marks the engine down
// ("Layer7 timeout") at its first check.
func TestHAProxyCheckWaitsForASlowHealthRoute(t *testing.T) {
	t.Parallel()
	u := gwtest.NewSlowHealthUpstream(t, "slow", 3*time.Second)
	m, _ := target.ForModel(model, []coord.Worker{gwtest.Worker(model, u.Addr, view.StateAdmitted, 1)})
	lines, _, err := render.HAProxy(m, render.HAProxyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hx := gwtest.StartHAProxy(t, `global
    stats socket {{socket}} level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend llm
    bind {{front}}
    default_backend qwen
backend qwen
    balance leastconn
`+string(lines))
	hx.WaitSlowChecksPass(t, "qwen", u, 2)
	if split := gwtest.Split(t, "http://"+hx.Front+"/", 5); split["slow"] != 5 {
		t.Fatalf("requests through the backend: %v, want all 5 answered by the engine", split)
	}
}

func TestNginxParses(t *testing.T) {
	file, rounding, err := render.NginxUpstream(render.Nginx{Upstream: "qwen", Directives: []string{"least_conn", "keepalive 32"}}, fleet())
	if err != nil {
		t.Fatal(err)
	}
	text := string(file)
	for _, want := range []string{"upstream qwen {\n", "    least_conn;\n", "    keepalive 32;\n",
		"    server 10.0.0.1:8000 weight=87;", "    server 10.0.0.2:8000 weight=40;",
		"    server 10.0.0.3:8000 down;", "    server 10.0.0.4:8000 down;", "    server 10.0.0.5:8000 down;"} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "max_conns") || strings.Contains(text, "10.0.0.9") {
		t.Errorf("max_conns by default, or another model's worker:\n%s", text)
	}
	if rounding <= 0 || rounding > 0.001 {
		t.Errorf("rounding error %g, want the 87/40 error (about 0.0001)", rounding)
	}
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://qwen; } }", text)

	capped, _, _ := render.NginxUpstream(render.Nginx{Upstream: "qwen", MaxConns: true}, fleet())
	if !strings.Contains(string(capped), "server 10.0.0.1:8000 weight=87 max_conns=22;") {
		t.Errorf("max_conns asked for:\n%s", capped)
	}
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://qwen; } }", string(capped))
}

func TestLiteLLMParses(t *testing.T) {
	ds, rounding := render.Deployments(render.LiteLLM{}, fleet())
	if rounding != 0 || len(ds) != 2 {
		t.Fatalf("deployments %+v, rounding %g", ds, rounding)
	}
	data, err := render.ModelList(ds)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ModelList []struct {
			ModelName string         `yaml:"model_name"`
			Params    map[string]any `yaml:"litellm_params"`
		} `yaml:"model_list"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, data)
	}
	if len(doc.ModelList) != 2 {
		t.Fatalf("model_list %+v", doc.ModelList)
	}
	first := doc.ModelList[0]
	if first.ModelName != model || first.Params["model"] != "hosted_vllm/"+model || first.Params["api_base"] != "http://10.0.0.1:8000/v1" ||
		first.Params["weight"] != 1.37 || first.Params["max_parallel_requests"] != 22 {
		t.Errorf("first deployment %+v", first)
	}
	empty, err := render.ModelList(nil)
	if err != nil || !strings.Contains(string(empty), "model_list: []") {
		t.Errorf("no deployments: %q, %v", empty, err)
	}
}

func TestHAProxyServerName(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.1:8000": "heft-10.0.0.1-8000", "gpu-a.example:8000": "heft-gpu-a.example-8000",
		"[fd00::5]:8000": "heft-fd00--5-8000", "a b:1": "heft-a_b-1",
	} {
		if got := render.HAProxyServerName(addr); got != want {
			t.Errorf("HAProxyServerName(%q) = %q, want %q", addr, got, want)
		}
	}
}

// The httpchk line asks the engines' own health route; engines of
// different routes in one backend get a connect check and a note. The
// check's timeout follows either way.
func TestHAProxyHealthCheck(t *testing.T) {
	ollama := func(addr string) coord.Worker {
		w := gwtest.Worker(model, addr, view.StateAdmitted, 1)
		w.Engine = "ollama"
		return w
	}
	for _, tc := range []struct {
		name    string
		workers []coord.Worker
		first   string
		note    bool
	}{
		{"ollama", []coord.Worker{ollama("10.0.0.1:11434"), ollama("10.0.0.2:11434")}, "    option httpchk GET /api/version\n    timeout check 5s\n", false},
		{"vllm and ollama", []coord.Worker{ollama("10.0.0.1:11434"), gwtest.Worker(model, "10.0.0.2:8000", view.StateAdmitted, 1)}, "    timeout check 5s\n    server ", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := target.ForModel(model, tc.workers)
			f, _ := render.Lookup("haproxy")
			out, err := f.Render(m, render.Request{Query: url.Values{}})
			if err != nil {
				t.Fatal(err)
			}
			text := string(out.Body)
			if !strings.HasPrefix(text, tc.first) || strings.Count(text, " check inter 2s fall 2 rise 2") != 2 {
				t.Errorf("want it to start with %q and two checked servers:\n%s", tc.first, text)
			}
			noted := strings.Contains(strings.Join(out.Notes, "\n"), "health routes differ")
			if noted != tc.note {
				t.Errorf("notes %q: a note of different routes %t, want %t", out.Notes, noted, tc.note)
			}
		})
	}
}
