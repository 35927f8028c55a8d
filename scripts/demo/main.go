// Command demo starts a whole simulated heft fleet on loopback: a
// coordinator, four simulated engines of different speeds (one with uneven
// data-parallel pools) and an agent beside each. It prints the dashboard's
// address, the agent token with a command that adds an agent of your own,
// then every change of a worker's state or weight, and stops everything on
// Ctrl-C. The logs folder stays until the next demo. `make demo` runs it.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// engine is one simulated worker of the demo fleet.
type engine struct {
	node string
	args []string
}

// The fleet: one model served by four very different workers. gpu-a
// decodes fastest but gpu-b reads long prompts fastest: their decode and
// prefill weights rank them apart.
var fleet = []engine{
	{"gpu-a", []string{"--flavor", "vllm", "--single-tps", "150", "--batch16-tps", "2000", "--prefill-tps", "12000",
		"--cold-factor", "3.6", "--cold-seconds", "3"}},
	{"gpu-b", []string{"--flavor", "sglang", "--single-tps", "80", "--batch16-tps", "900", "--prefill-tps", "30000"}},
	{"mac-c", []string{"--flavor", "mlx", "--single-tps", "45", "--batch16-tps", "300", "--prefill-tps", "6000"}},
	{"gpu-d", []string{"--flavor", "sglang", "--single-tps", "80", "--batch16-tps", "900", "--prefill-tps", "20000",
		"--dp", "2", "--kv-tokens", "24094,2925"}},
}

const model = "Qwen/Qwen3-8B"

func main() {
	bin := flag.String("bin", "bin", "folder with heft-coordinator, heft-agent and heft-sim")
	listen := flag.String("listen", "127.0.0.1:7070", "coordinator address (a free port is used if this one is taken)")
	settle := flag.Bool("until-settled", false, "exit 0 once every worker reached its final state (for tests)")
	limit := flag.Duration("timeout", 0, "give up after this long (0 = run until Ctrl-C)")
	logs := flag.String("logs", filepath.Join(os.TempDir(), "heft-demo"), "folder for the fleet's logs, state and configs; emptied when a demo starts, kept when it stops")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *limit)
		defer cancel()
	}
	if err := run(ctx, *bin, *listen, *logs, *settle); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin, listen, dir string, settle bool) error {
	if err := freshDir(dir); err != nil {
		return err
	}
	// Said last, after every process stopped, so it is the line left on screen.
	defer fmt.Printf("logs kept in %s until the next demo\n", dir)
	var procs []*process
	defer func() {
		// Stop agents first, then engines, then the coordinator.
		for i := len(procs) - 1; i >= 0; i-- {
			stopProcess(procs[i])
		}
	}()
	start := func(name string, args ...string) (*process, io.Reader, error) {
		logf, err := os.Create(filepath.Join(dir, name+".out"))
		if err != nil {
			return nil, nil, err
		}
		cmd := exec.Command(filepath.Join(bin, args[0]), args[1:]...)
		pr, pw := io.Pipe()
		cmd.Stdout = io.MultiWriter(logf, pw)
		cmd.Stderr = logf
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("start %s: %w (run `make build` first)", name, err)
		}
		p := &process{cmd: cmd, done: make(chan struct{})}
		procs = append(procs, p)
		go func() { cmd.Wait(); pw.Close(); logf.Close(); close(p.done) }()
		return p, pr, nil
	}

	addr, err := freeAddr(listen)
	if err != nil {
		return err
	}
	// Fresh tokens for every demo: the coordinator refuses short ones.
	agentToken, adminToken := rand.Text()+rand.Text(), rand.Text()+rand.Text()
	tokenFile := filepath.Join(dir, "agent.token")
	if err := os.WriteFile(tokenFile, []byte(agentToken+"\n"), 0o600); err != nil {
		return err
	}
	// The demo's engines are the operator's own, weighed from their first
	// measurement and admitted without an admin: no probation, no approval
	// of new names (a real install keeps both; docs/security.md).
	// Every gateway of a one-host fleet runs here, so the engines' loopback
	// addresses are routable: single_host says so, and not_routable, which
	// a real fleet needs, is not raised.
	coordCfg := filepath.Join(dir, "coordinator.toml")
	if err := os.WriteFile(coordCfg, fmt.Appendf(nil, "listen = %q\nstate_dir = %q\nagent_token = %q\nadmin_token = %q\nprobation = \"0s\"\napprove_new_nodes = false\nsingle_host = true\n",
		addr, filepath.Join(dir, "state"), agentToken, adminToken), 0o600); err != nil {
		return err
	}
	_, out, err := start("coordinator", "heft-coordinator", "--config", coordCfg)
	if err != nil {
		return err
	}
	go io.Copy(io.Discard, out)
	base := "http://" + addr
	if err := waitHTTP(ctx, base+"/healthz", 20*time.Second); err != nil {
		return fmt.Errorf("coordinator did not come up (see %s): %w", filepath.Join(dir, "coordinator.out"), err)
	}

	for _, e := range fleet {
		logPath := filepath.Join(dir, e.node+"-engine.log")
		args := append([]string{"heft-sim", "--listen", "127.0.0.1:0", "--model", model, "--log", logPath}, e.args...)
		_, out, err := start(e.node+"-sim", args...)
		if err != nil {
			return err
		}
		url, err := firstURL(ctx, out, 20*time.Second)
		if err != nil {
			return fmt.Errorf("%s: heft-sim printed no URL: %w", e.node, err)
		}
		kind := e.args[1]
		agentCfg := filepath.Join(dir, e.node+"-agent.toml")
		// A one-host fleet: gateways run here too, so the loopback URL is
		// what they dial (advertise_url, and single_host above). Only vLLM's and
		// SGLang's start-up logs carry KV pools.
		engineCfg := fmt.Sprintf("[[engine]]\nkind = %q\nurl = %q\nadvertise_url = %q\n", kind, url, url)
		if kind == "vllm" || kind == "sglang" {
			engineCfg += fmt.Sprintf("log = %q\n", logPath)
		}
		if err := os.WriteFile(agentCfg, fmt.Appendf(nil, "state_dir = %q\n[coordinator]\nurl = %q\ntoken = %q\n[node]\nname = %q\n%s",
			filepath.Join(dir, e.node+"-state"), "ws://"+addr+"/api/v1/agent", agentToken, e.node, engineCfg), 0o600); err != nil {
			return err
		}
		if _, out, err = start(e.node+"-agent", "heft-agent", "run", "--config", agentCfg); err != nil {
			return err
		}
		go io.Copy(io.Discard, out)
		fmt.Printf("started %-6s %-7s engine at %s with its agent\n", e.node, kind, url)
	}

	fmt.Printf("\nheft demo fleet is up.\n  dashboard:  %s/\n  workers:    curl -s %s/api/v1/workers\n  weights:    curl -s %s/api/v1/models/%s/weights\n"+
		"  prefill:    curl -s '%s/api/v1/models/%s/weights?kind=prefill'\n  admin token (for pins in the dashboard): %s\n"+
		"  agent token: %s (also in %s)\n  add your own agent (a fifth simulated engine and its agent):\n    %s\n"+
		"  logs:       %s (kept until the next demo)\nPress Ctrl-C to stop.\n\n",
		base, base, base, model, base, model, adminToken, agentToken, tokenFile, addAgent(bin, addr, tokenFile, dir), dir)
	return watch(ctx, base, settle)
}

// addAgent is one shell line that starts a simulated engine on a free port
// and an agent beside it, reporting to the demo's coordinator.
func addAgent(bin, addr, tokenFile, dir string) string {
	url := "http://127.0.0.1:8099"
	if a, err := freeAddr("127.0.0.1:8099"); err == nil {
		url = "http://" + a
	}
	return fmt.Sprintf("%s --listen %s --model %s --flavor vllm --single-tps 100 --batch16-tps 1200 --prefill-tps 15000 & %s run --coordinator ws://%s/api/v1/agent --token-file %s --node my-node --state-dir %s --engine vllm=%s,advertise=%s",
		filepath.Join(bin, "heft-sim"), strings.TrimPrefix(url, "http://"), model, filepath.Join(bin, "heft-agent"), addr, tokenFile,
		filepath.Join(dir, "my-node-state"), url, url)
}

// freshDir empties the logs folder of the last demo, or makes it. A folder
// that is not empty and was not a demo's is refused, never emptied.
func freshDir(dir string) error {
	const mark = ".heft-demo"
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(dir, mark)); err != nil {
			return fmt.Errorf("logs folder %s holds files that are not a demo's; name another with --logs", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, mark), []byte("the heft demo's logs folder: emptied when the next demo starts\n"), 0o600)
}

// watch prints each worker's state and weight whenever they change.
func watch(ctx context.Context, base string, settle bool) error {
	seen := map[string]string{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if settle {
				return fmt.Errorf("the fleet did not settle: %w", ctx.Err())
			}
			fmt.Println("\nstopping the demo fleet")
			return nil
		case <-tick.C:
		}
		workers, err := fetchWorkers(ctx, base)
		if err != nil {
			continue
		}
		settled := len(workers) == len(fleet)
		for _, w := range workers {
			line := describe(w)
			if seen[w.ID] != line {
				seen[w.ID] = line
				fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), line)
			}
			if w.State != "admitted" && w.State != "held" {
				settled = false
			}
		}
		if settle && settled {
			fmt.Println("all workers settled")
			return nil
		}
	}
}

type worker struct {
	ID         string   `json:"id"`
	Node       string   `json:"node"`
	Engine     string   `json:"engine"`
	State      string   `json:"state"`
	Throughput *float64 `json:"throughput_tps"`
	Weight     *float64 `json:"weight"`
	Prefill    *float64 `json:"prefill_tps"`
	PrefillW   *float64 `json:"prefill_weight"`
	Warnings   []struct {
		Code     string `json:"code"`
		Severity string `json:"severity"`
	} `json:"warnings"`
}

func describe(w worker) string {
	s := fmt.Sprintf("%-6s %-7s %-9s", w.Node, w.Engine, w.State)
	if w.Throughput != nil {
		s += fmt.Sprintf(" %7.0f tok/s", *w.Throughput)
	}
	if w.Weight != nil {
		s += fmt.Sprintf("  weight %.2f", *w.Weight)
	}
	if w.Prefill != nil {
		s += fmt.Sprintf("  prefill %.0f tok/s", *w.Prefill)
	}
	if w.PrefillW != nil {
		s += fmt.Sprintf("  prefill weight %.2f", *w.PrefillW)
	}
	var codes []string
	for _, x := range w.Warnings {
		codes = append(codes, x.Severity+":"+x.Code)
	}
	sort.Strings(codes)
	if len(codes) > 0 {
		s += "  [" + strings.Join(codes, " ") + "]"
	}
	return s
}

func fetchWorkers(ctx context.Context, base string) ([]worker, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/workers", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Workers []worker `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	return body.Workers, nil
}

// freeAddr returns want if it can be listened on, else a free loopback port.
func freeAddr(want string) (string, error) {
	for _, a := range []string{want, "127.0.0.1:0"} {
		ln, err := net.Listen("tcp", a)
		if err == nil {
			addr := ln.Addr().String()
			ln.Close()
			return addr, nil
		}
	}
	return "", errors.New("no free loopback port")
}

var urlRE = regexp.MustCompile(`http://127\.0\.0\.1:\d+`)

// firstURL reads a process's output until it names its address, then
// drains the rest so the process never blocks on a full pipe.
func firstURL(ctx context.Context, r io.Reader, limit time.Duration) (string, error) {
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sent := false
		for sc.Scan() {
			if m := urlRE.FindString(sc.Text()); m != "" && !sent {
				found <- m
				sent = true
			}
		}
		if !sent {
			close(found)
		}
	}()
	select {
	case u, ok := <-found:
		if !ok {
			return "", errors.New("process ended")
		}
		return u, nil
	case <-time.After(limit):
		return "", errors.New("timed out")
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func waitHTTP(ctx context.Context, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("HTTP %d", resp.StatusCode)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// process is a child of the demo and a channel closed when it has exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func stopProcess(p *process) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}
