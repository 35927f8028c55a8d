package engine

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"heft/shared/testutil"
)

// Child-process modes of the test binary, chosen by environment:
//
//	HEFT_ENGINE_TEST_CHILD=serve:KIND   listen on 127.0.0.1:0, serve KIND's
//	                                    fixtures, print "PORT n", live until
//	                                    stdin closes
//	HEFT_ENGINE_TEST_CHILD=parent:KIND  start the test binary again as a
//	                                    "serve" child whose argv is a bare
//	                                    process title, then wait for it
//
// They let the tests find a real listener in another process by its port
// and read its real command line.
const childEnv = "HEFT_ENGINE_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	testutil.VerifyNoLeaks(m)
}

func runChild(mode string) int {
	role, kind, _ := strings.Cut(mode, ":")
	switch role {
	case "serve":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		srv := &http.Server{Handler: fakeEngine(kind, nil), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
		_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes our stdin
		return 0
	case "parent":
		self, err := os.Executable()
		if err != nil {
			return 1
		}
		cmd := &exec.Cmd{Path: self, Args: []string{"VLLM::APIServer"}, Env: append(os.Environ(), childEnv+"=serve:"+kind),
			Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
		if err := cmd.Run(); err != nil {
			return 1
		}
		return 0
	}
	return 2
}

// child is a test-binary process started with a chosen argv.
type child struct {
	cmd   *exec.Cmd
	port  int
	stdin io.Closer
	once  sync.Once
}

// startChild runs the test binary with argv as its command line in the
// given mode and waits (with a deadline) for the port it listens on.
func startChild(t *testing.T, mode string, argv []string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{Path: self, Args: argv, Env: append(os.Environ(), childEnv+"="+mode)}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(c.stop)
	portc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var p int
			if _, err := fmt.Sscanf(sc.Text(), "PORT %d", &p); err == nil {
				portc <- p
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case c.port = <-portc:
	case <-time.After(20 * time.Second):
		t.Fatal("child did not report its port")
	}
	return c
}

// stop ends the child (closing its stdin ends it and its own child) and
// waits for it.
func (c *child) stop() {
	c.once.Do(func() {
		_ = c.stdin.Close()
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	})
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
