package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"heft/shared/view"
)

// Tokens the bench's coordinators are configured with.
const (
	agentToken = "bench-agent-token-0123456789abcdef"
	adminToken = "bench-admin-token-0123456789abcdef"
)

// httpClient is the bench's API client.
var httpClient = &http.Client{Timeout: 2 * time.Minute}

// coordinator is a heft-coordinator process with a fresh state folder.
type coordinator struct {
	*child
	api string // http://127.0.0.1:port
	ws  string // ws://127.0.0.1:port/api/v1/agent
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startCoordinator starts a coordinator; extra is appended to its TOML.
func (e *env) startCoordinator(ctx context.Context, name string, extra ...string) (*coordinator, error) {
	bin, err := binPath(e.bin, "heft-coordinator")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.work, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// The swarm's agents stand for nodes elsewhere (10.x.y.z engines) while
	// they connect over loopback: advertise_allow lets them offer those.
	cfg := fmt.Sprintf("listen = %q\nstate_dir = %q\nagent_token = %q\nadmin_token = %q\nadvertise_allow = [\"0.0.0.0/0\", \"::/0\"]\napprove_new_nodes = false\nnew_nodes_per_minute_per_token = 0\nnew_nodes_per_minute_per_address = 0\n",
		addr, filepath.Join(dir, "state"), agentToken, adminToken) + strings.Join(extra, "\n")
	cfgPath := filepath.Join(dir, "coordinator.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	c, err := startChild(dir, "coordinator", bin, []string{"--config", cfgPath}, childIO{})
	if err != nil {
		return nil, err
	}
	co := &coordinator{child: c, api: "http://" + addr, ws: "ws://" + addr + "/api/v1/agent"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := httpClient.Get(co.api + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return co, nil
			}
		}
		if !c.Alive() || time.Now().After(deadline) || ctx.Err() != nil {
			c.Stop(5 * time.Second)
			return nil, fmt.Errorf("coordinator did not become healthy on %s%s", addr, c.stderrTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// getJSON GETs path from the API into v and returns the body size.
func getJSON(ctx context.Context, api, path string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return len(body), fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	if v == nil {
		return len(body), nil
	}
	return len(body), json.Unmarshal(body, v)
}

func (co *coordinator) workers(ctx context.Context) ([]view.Worker, error) {
	var ws view.Workers
	_, err := getJSON(ctx, co.api, "/api/v1/workers", &ws)
	return ws.Workers, err
}

func weightsPath(model string) string {
	return "/api/v1/models/" + model + "/weights"
}

func (co *coordinator) weights(ctx context.Context, model string) (view.Weights, error) {
	var w view.Weights
	_, err := getJSON(ctx, co.api, weightsPath(model), &w)
	return w, err
}

// simProc is a heft-sim process.
type simProc struct {
	*child
	url string
	log string
}

// startSimProc starts heft-sim for c; notReady keeps /health at 503 that long.
func (e *env) startSimProc(dir, name string, c Calibration, notReady time.Duration) (*simProc, error) {
	return e.startSimProcAt(dir, name, c, notReady, "127.0.0.1:0", nil)
}

// startSimProcAt starts a heft-sim on listen with env added to its
// environment (HEFT_SIM_SLOW_FACTOR: slower with the same command line).
func (e *env) startSimProcAt(dir, name string, c Calibration, notReady time.Duration, listen string, env []string) (*simProc, error) {
	bin, err := binPath(e.bin, "heft-sim")
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, name+"-engine.log")
	args := []string{"--flavor", c.Flavor, "--listen", listen, "--model", benchModel,
		"--single-tps", ftoa(c.SingleTPS), "--batch16-tps", ftoa(c.Batch16TPS), "--dp", strconv.Itoa(c.ranks()),
		"--log", logPath, "--seed", "1"}
	if c.MaxRunning > 0 {
		args = append(args, "--max-running", strconv.Itoa(c.MaxRunning))
	}
	if len(c.KVTokens) > 0 {
		args = append(args, "--kv-tokens", joinInts(c.KVTokens, ","))
	}
	if notReady > 0 {
		args = append(args, "--fault-not-ready-for", notReady.String())
	}
	if c.Slow.Factor > 1 {
		args = append(args, "--slow-at", c.Slow.At.String(), "--slow-factor", ftoa(c.Slow.Factor))
	}
	if c.SpecAccept > 1 {
		args = append(args, "--spec-accept", strconv.Itoa(c.SpecAccept))
	}
	ch, err := startChild(dir, name+"-sim", bin, args, childIO{Lines: true, Env: env})
	if err != nil {
		return nil, err
	}
	line, err := ch.Line(context.Background(), 20*time.Second)
	if err != nil {
		ch.Stop(5 * time.Second)
		return nil, err
	}
	if _, err := url.Parse(line); err != nil || !strings.HasPrefix(line, "http://") {
		ch.Stop(5 * time.Second)
		return nil, fmt.Errorf("heft-sim printed %q, not its URL", line)
	}
	return &simProc{child: ch, url: line, log: logPath}, nil
}

func ftoa(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// startAgent starts heft-agent run for one engine; prefill false turns
// the prefill burst off (area 4 times the decode probe alone).
// env is added to the agent's environment.
func (e *env) startAgent(dir, node string, co *coordinator, kind string, s *simProc, prefill bool, env ...string) (*child, error) {
	bin, err := binPath(e.bin, "heft-agent")
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "state_dir = %q\n\n[coordinator]\nurl = %q\ntoken = %q\n\n[node]\nname = %q\n\n", filepath.Join(dir, node+"-state"), co.ws, agentToken, node)
	fmt.Fprintf(&b, "[[engine]]\nkind = %q\nurl = %q\nlog = %q\n", kind, s.url, s.log)
	fmt.Fprintf(&b, "\n[probe]\nprefill = %v\n", prefill)
	if e.passiveWindow > 0 {
		fmt.Fprintf(&b, "passive_window = %q\n", e.passiveWindow)
	}
	if e.paceWindow > 0 {
		fmt.Fprintf(&b, "pace_window = %q\n", e.paceWindow)
	}
	if e.probeBusy != "" {
		fmt.Fprintf(&b, "busy = %q\n", e.probeBusy)
	}
	if e.tokens != 128 {
		fmt.Fprintf(&b, "tokens = %d\n", e.tokens)
	}
	cfgPath := filepath.Join(dir, node+"-agent.toml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		return nil, err
	}
	return startChild(dir, node+"-agent", bin, []string{"run", "--config", cfgPath}, childIO{Env: env})
}

// samePort reports whether two URLs name the same loopback port, however
// the agent normalised the rest.
func samePort(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Port() != "" && ua.Port() == ub.Port()
}

// stopAll stops children in reverse start order.
func stopAll(cs []*child) {
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i] != nil {
			cs[i].Stop(10 * time.Second)
		}
	}
}
