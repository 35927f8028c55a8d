package engine

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"heft/agent/internal/testchild"
	"heft/shared/testutil"
)

// childEnv chooses what the test binary does as a child process
// (testchild): "serve:KIND" serves KIND's fixtures on a port it reports;
// "parent:KIND" starts a "serve:KIND" child under a bare process title and
// waits for it. They let the tests find a real engine in another process
// by its port and read its real command line.
const childEnv = "HEFT_ENGINE_TEST_CHILD"

func TestMain(m *testing.M) {
	role, kind, _ := strings.Cut(os.Getenv(childEnv), ":")
	switch role {
	case "":
		testutil.VerifyNoLeaks(m)
	case "serve":
		os.Exit(testchild.Serve(fakeEngine(kind, nil)))
	case "parent":
		os.Exit(testchild.Parent("VLLM::APIServer", childEnv+"=serve:"+kind))
	default:
		os.Exit(2)
	}
}

// startChild runs the test binary as a child in mode with argv as its
// command line.
func startChild(t *testing.T, mode string, argv []string) *testchild.Child {
	t.Helper()
	return testchild.Start(t, argv, childEnv+"="+mode)
}

// testdataDir is the repository's testdata/, from the package's folder,
// where tests and the child processes they start run.
var testdataDir = filepath.Join("..", "..", "testdata")

// fixtureRoutes maps each kind's endpoints to fixture files under
// testdata/; "" serves an empty 200.
var fixtureRoutes = map[string]map[string]string{
	"vllm": {
		"/v1/models": "http/vllm/v1_models.json",
		"/version":   "http/vllm/version.json",
		"/health":    "",
		"/metrics":   "engines/vllm-dp2-metrics.txt",
	},
	"sglang": {
		"/v1/models":   "http/sglang/v1_models.json",
		"/server_info": "http/sglang/server_info.json",
		"/health":      "",
		"/metrics":     "engines/sglang-dp2-uneven-metrics.txt",
		"/v1/loads":    "http/sglang/v1_loads.json",
		"/get_load":    "http/sglang/get_load.json",
	},
	"llamacpp": {
		"/v1/models": "http/llamacpp/v1_models.json",
		"/props":     "http/llamacpp/props.json",
		"/slots":     "http/llamacpp/slots.json",
		"/health":    "http/llamacpp/health.json",
		"/metrics":   "metrics/llamacpp.txt",
	},
	"ollama": {
		"/v1/models":   "http/ollama/v1_models.json",
		"/api/version": "http/ollama/api_version.json",
		"/api/ps":      "http/ollama/api_ps.json",
	},
	"mlx": {
		"/v1/models": "http/mlx/v1_models.json",
		"/health":    "http/mlx/health.json",
	},
}

// fakeEngine serves a kind's fixtures. override replaces or adds
// handlers by path; a nil handler removes the path (404).
func fakeEngine(kind string, override map[string]http.HandlerFunc) http.Handler {
	routes := fixtureRoutes[kind]
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, ok := override[r.URL.Path]; ok {
			if h == nil {
				http.NotFound(w, r)
				return
			}
			h(w, r)
			return
		}
		file, ok := routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if file == "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		switch {
		case strings.HasSuffix(file, ".json"):
			w.Header().Set("Content-Type", "application/json")
		default:
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		}
		b, err := os.ReadFile(filepath.Join(testdataDir, file))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write(b)
	})
}

// startFake runs a fake engine on 127.0.0.1 in this process.
func startFake(t *testing.T, kind string, override map[string]http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(fakeEngine(kind, override))
	t.Cleanup(srv.Close)
	return srv
}
