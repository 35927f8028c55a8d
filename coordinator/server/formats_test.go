package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"heft/gateway/gwtest"
	"heft/shared/testutil"
	"heft/shared/view"
)

// formatsFleet is a model served by two admitted workers (weights 1.37
// and 0.63, caps 22 and 16) and a held one, through the server's agent
// socket and the fake fleet.
func formatsFleet(t *testing.T) *testServer {
	t.Helper()
	ts := startServer(t, testOptions(), nil)
	a := connectAgent(t, ts, "gpu-a")
	a.snapshot("Qwen/Qwen3-8B", "fast", "slow", "held")
	testutil.Eventually(t, "three workers", 10*time.Second, func() bool { return len(ts.fleet.Workers()) == 3 })
	set := func(id, addr, state string, weight float64, maxConc int) {
		ts.fleet.update("gpu-a/"+id, func(w *view.Worker) {
			w.Address, w.State = addr, state
			if weight > 0 {
				w.Weight = &weight
			}
			w.MaxConcurrency = &maxConc
		})
	}
	set("fast", "10.0.0.1:8000", view.StateAdmitted, 1.37, 22)
	set("slow", "10.0.0.2:8000", view.StateAdmitted, 0.63, 16)
	set("held", "10.0.0.3:8000", view.StateHeld, 0, 16)
	return ts
}

const weightsPath = "/api/v1/models/Qwen/Qwen3-8B/weights"

func TestWeightsAsHAProxy(t *testing.T) {
	ts := formatsFleet(t)
	status, body, hdr := ts.do(t, "GET", weightsPath+"?format=haproxy", "", nil)
	if status != http.StatusOK || hdr.Get("Content-Type") != "text/plain; charset=utf-8" || hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %v\n%s", status, hdr, body)
	}
	text := string(body)
	for _, want := range []string{`# heft weights of model "Qwen/Qwen3-8B"`, "2 of 3 workers serve",
		"server heft-10.0.0.1-8000 10.0.0.1:8000 weight 137 maxconn 22", "server heft-10.0.0.2-8000 10.0.0.2:8000 weight 63 maxconn 16",
		"server heft-10.0.0.3-8000 10.0.0.3:8000 weight 1 maxconn 16 check inter 2s fall 2 rise 2 disabled", "option httpchk GET /health", "error of a worker's share of traffic after rounding: 0.00%"} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
	gwtest.CheckHAProxyConfig(t, "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n"+
		"frontend llm\n    bind 127.0.0.1:9\n    default_backend qwen\nbackend qwen\n    balance leastconn\n    option http-no-delay\n"+text)
}

// With agent_check, each server asks the coordinator for its state.
func TestWeightsAsHAProxyWithAgentCheck(t *testing.T) {
	ts := formatsFleet(t)
	status, body, _ := ts.do(t, "GET", weightsPath+"?format=haproxy&agent_check=10.0.0.100:7071", "", nil)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	text := string(body)
	for _, want := range []string{
		`server heft-10.0.0.1-8000 10.0.0.1:8000 weight 100 maxconn 22 check inter 2s fall 2 rise 2 agent-check agent-addr 10.0.0.100 agent-port 7071 agent-inter 2s agent-send "Qwen/Qwen3-8B 10.0.0.1:8000\n"`,
		`server heft-10.0.0.3-8000 10.0.0.3:8000 weight 100 maxconn 16 check inter 2s fall 2 rise 2 disabled agent-check agent-addr 10.0.0.100 agent-port 7071 agent-inter 2s agent-send "Qwen/Qwen3-8B 10.0.0.3:8000\n"`,
		"asks the coordinator's agent check at 10.0.0.100:7071",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
	gwtest.CheckHAProxyConfig(t, "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n"+
		"frontend llm\n    bind 127.0.0.1:9\n    default_backend qwen\nbackend qwen\n    balance leastconn\n    option http-no-delay\n"+text)
}

func TestWeightsAsNginx(t *testing.T) {
	ts := formatsFleet(t)
	status, body, hdr := ts.do(t, "GET", weightsPath+"?format=nginx", "", nil)
	if status != http.StatusOK || hdr.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("%d %v\n%s", status, hdr, body)
	}
	text := string(body)
	for _, want := range []string{"upstream Qwen_Qwen3-8B {", "server 10.0.0.1:8000 weight=87;", "server 10.0.0.2:8000 weight=40;", "server 10.0.0.3:8000 down;"} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://Qwen_Qwen3-8B; } }", text)

	_, body, _ = ts.do(t, "GET", weightsPath+"?format=nginx&upstream=qwen&max_conns=true", "", nil)
	if !strings.Contains(string(body), "upstream qwen {") || !strings.Contains(string(body), "weight=87 max_conns=22;") {
		t.Errorf("upstream=qwen&max_conns=true:\n%s", body)
	}
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://qwen; } }", string(body))
}

func TestWeightsAsLiteLLM(t *testing.T) {
	ts := formatsFleet(t)
	status, body, hdr := ts.do(t, "GET", weightsPath+"?format=litellm&model_name=qwen&provider=openai", "", nil)
	if status != http.StatusOK || hdr.Get("Content-Type") != "application/yaml; charset=utf-8" {
		t.Fatalf("%d %v\n%s", status, hdr, body)
	}
	var doc struct {
		ModelList []struct {
			ModelName string         `yaml:"model_name"`
			Params    map[string]any `yaml:"litellm_params"`
		} `yaml:"model_list"`
	}
	if err := yaml.Unmarshal(body, &doc); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, body)
	}
	if len(doc.ModelList) != 2 {
		t.Fatalf("model_list has %d deployments, want the 2 serving:\n%s", len(doc.ModelList), body)
	}
	d := doc.ModelList[0]
	if d.ModelName != "qwen" || d.Params["model"] != "openai/Qwen/Qwen3-8B" || d.Params["api_base"] != "http://10.0.0.1:8000/v1" ||
		d.Params["weight"] != 1.37 || d.Params["max_parallel_requests"] != 22 {
		t.Errorf("first deployment %+v", d)
	}
}

func TestWeightsFormatErrors(t *testing.T) {
	ts := formatsFleet(t)
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{weightsPath + "?format=envoy", http.StatusBadRequest, `format "envoy": want one of json, haproxy, nginx, litellm`},
		{weightsPath + "?format=nginx&upstream=a%20b", http.StatusBadRequest, "not an nginx upstream name"},
		{"/api/v1/models/Nope/weights?format=haproxy", http.StatusNotFound, `no model "Nope"`},
		{weightsPath + "?format=haproxy&agent_check=coord", http.StatusBadRequest, `agent_check "coord" is not host:port`},
		{weightsPath + "?format=haproxy&agent_check=coord:7071&agent_inter=2%20s", http.StatusBadRequest, "not an HAProxy time"},
		{weightsPath + "?format=haproxy&agent_inter=2s", http.StatusBadRequest, "agent_inter needs agent_check"},
	} {
		status, body, hdr := ts.do(t, "GET", tc.path, "", nil)
		if status != tc.status || hdr.Get("Content-Type") != "application/json" || !strings.Contains(errorMessage(t, body), tc.want) {
			t.Errorf("%s: %d %s", tc.path, status, body)
		}
	}
	// format=json is the JSON table.
	status, body, hdr := ts.do(t, "GET", weightsPath+"?format=json", "", nil)
	if status != http.StatusOK || hdr.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"workers"`) {
		t.Errorf("format=json: %d %s", status, body)
	}
}

// ?kind=prefill renders the prefill weights: the worker without one is
// left out (drained), and LiteLLM's deployments say what each holds.
func TestWeightsPrefillKind(t *testing.T) {
	ts := formatsFleet(t)
	ts.fleet.update("gpu-a/slow", func(w *view.Worker) {
		p, c := 2.5, int64(40960)
		w.PrefillWeight, w.MaxContextTokens = &p, &c
	})
	status, body, _ := ts.do(t, "GET", weightsPath+"?format=litellm&kind=prefill&model_name=qwen-long", "", nil)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	var doc struct {
		ModelList []struct {
			ModelName string         `yaml:"model_name"`
			Params    map[string]any `yaml:"litellm_params"`
			Info      map[string]any `yaml:"model_info"`
		} `yaml:"model_list"`
	}
	if err := yaml.Unmarshal(body, &doc); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, body)
	}
	if len(doc.ModelList) != 1 || doc.ModelList[0].Params["api_base"] != "http://10.0.0.2:8000/v1" || doc.ModelList[0].Params["weight"] != 2.5 ||
		doc.ModelList[0].Info["max_input_tokens"] != 40960 || !strings.Contains(string(body), "# heft prefill weights of model") {
		t.Errorf("prefill model_list:\n%s", body)
	}
	status, body, _ = ts.do(t, "GET", weightsPath+"?format=nginx&kind=prefill&upstream=qwen_long", "", nil)
	if status != http.StatusOK || !strings.Contains(string(body), "server 10.0.0.2:8000 weight=") || !strings.Contains(string(body), "server 10.0.0.1:8000 down;") {
		t.Errorf("prefill nginx: %d\n%s", status, body)
	}
	if status, body, _ := ts.do(t, "GET", weightsPath+"?format=nginx&kind=speed", "", nil); status != http.StatusBadRequest {
		t.Errorf("kind=speed: %d %s", status, body)
	}
}

// What an agent says reaches the renderings as worker IDs (capacity keys)
// and addresses. Each of these once became configuration: a server line
// nginx -t took, a listen section haproxy -c took, LiteLLM's master key.
// Now each is a comment, escaped, or left out with the reason why.
func TestWeightsFormatsHostileWorker(t *testing.T) {
	ts := formatsFleet(t)
	ts.fleet.update("gpu-a/slow", func(w *view.Worker) {
		w.ID = "gpu-a/slow\n    server 127.0.0.1:1 weight=100;\nlisten evil\n    bind 127.0.0.1:1\ngeneral_settings:\n  master_key: sk-evil"
	})
	ts.fleet.update("gpu-a/held", func(w *view.Worker) {
		w.ID, w.Address = "gpu-a/held\ngeneral_settings:\n  master_key: sk-evil\nlisten evil2\n    bind 127.0.0.1:2", "unix:80"
		w.State = view.StateAdmitted
	})
	injected := func(body []byte) []string {
		var out []string
		for _, l := range strings.Split(string(body), "\n") {
			l, _, _ = strings.Cut(l, "#") // what the gateway reads of the line
			for _, bad := range []string{"127.0.0.1:1", "unix", "listen", "general_settings", "master_key"} {
				if strings.Contains(l, bad) {
					out = append(out, l)
				}
			}
		}
		return out
	}
	_, body, _ := ts.do(t, "GET", weightsPath+"?format=litellm", "", nil)
	var top map[string]any
	if err := yaml.Unmarshal(body, &top); err != nil || len(top) != 1 || top["model_list"] == nil {
		t.Errorf("litellm: top-level %v (%v):\n%s", top, err, body)
	}
	if bad := injected(body); len(bad) > 0 || !strings.Contains(string(body), `left out: not in heft's grammar: host "unix"`) {
		t.Errorf("litellm: injected %q, or the worker at unix:80 not named as left out:\n%s", bad, body)
	}

	_, body, _ = ts.do(t, "GET", weightsPath+"?format=nginx&upstream=qwen", "", nil)
	if bad := injected(body); len(bad) > 0 || strings.Count(string(body), "\n    server ") != 2 {
		t.Errorf("nginx: injected %q, or not the 2 workers:\n%s", bad, body)
	}
	gwtest.CheckNginxConfig(t, "    include {{upstream_file}};\n    server { listen {{front}}; location / { proxy_pass http://qwen; } }", string(body))

	_, body, _ = ts.do(t, "GET", weightsPath+"?format=haproxy", "", nil)
	if bad := injected(body); len(bad) > 0 || strings.Count(string(body), "\n    server ") != 2 {
		t.Errorf("haproxy: injected %q, or not the 2 workers:\n%s", bad, body)
	}
	gwtest.CheckHAProxyConfig(t, "defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n"+
		"frontend llm\n    bind 127.0.0.1:9\n    default_backend qwen\nbackend qwen\n    balance leastconn\n"+string(body))
}

// agent_token_env names HAProxy's variable the token comes from; without a
// viewer token the coordinator's agent checks take none, so asking for one
// is a mistake, said so.
func TestWeightsAsHAProxyAgentTokenEnv(t *testing.T) {
	ts := formatsFleet(t)
	status, body, _ := ts.do(t, "GET", weightsPath+"?format=haproxy&agent_check=10.0.0.100:7071&agent_token_env=HX_TOKEN", "", nil)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "has no viewer token") {
		t.Errorf("agent_token_env without a viewer token: %d %s", status, body)
	}
	status, body, _ = ts.do(t, "GET", weightsPath+"?format=haproxy&agent_token_env=HX_TOKEN", "", nil)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "agent_token_env needs agent_check") {
		t.Errorf("agent_token_env without agent_check: %d %s", status, body)
	}

	opts := testOptions()
	opts.Tokens.Viewer = "viewer-token-for-the-render-test"
	vs := startServer(t, opts, nil)
	a := connectAgent(t, vs, "gpu-a")
	a.snapshot("Qwen/Qwen3-8B", "fast")
	testutil.Eventually(t, "one worker", 10*time.Second, func() bool { return len(vs.fleet.Workers()) == 1 })
	for query, want := range map[string]string{
		"":                          `agent-send "${HEFT_VIEWER_TOKEN} Qwen/Qwen3-8B `,
		"&agent_token_env=HX_TOKEN": `agent-send "${HX_TOKEN} Qwen/Qwen3-8B `,
	} {
		status, body, _ := vs.do(t, "GET", weightsPath+"?format=haproxy&agent_check=10.0.0.100:7071"+query, opts.Tokens.Viewer, nil)
		if status != http.StatusOK || !strings.Contains(string(body), want) || strings.Contains(string(body), opts.Tokens.Viewer) {
			t.Errorf("%q: %d, want %q and not the token itself:\n%s", query, status, want, body)
		}
	}
	status, body, _ = vs.do(t, "GET", weightsPath+"?format=haproxy&agent_check=10.0.0.100:7071&agent_token_env=1BAD", opts.Tokens.Viewer, nil)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "not an environment variable's name") {
		t.Errorf("a bad variable name: %d %s", status, body)
	}
}
