package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"heft/agent/gpu"
	"heft/agent/probe"
	"heft/shared/logging"
	"heft/shared/testutil"
	"heft/sim"
)

func probeSim(t *testing.T, faults sim.Faults) *sim.Server {
	t.Helper()
	s, err := sim.Start(sim.Config{SingleTPS: 2000, Batch16TPS: 16000, Seed: 3, Faults: faults}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// prefillProbeSim is probeSim reading prompts at 10,000 tok/s, so that a
// prefill burst of 4 × 1,024 tokens takes about 0.4 s. Slower would cost
// time; faster fails on a loaded machine: a 1,024-token prompt read in
// 20 ms came within 4 decode steps stretched to 6 ms by the load, and the
// probe rightly called it cached.
func prefillProbeSim(t *testing.T, faults sim.Faults) *sim.Server {
	t.Helper()
	s, err := sim.Start(sim.Config{SingleTPS: 2000, Batch16TPS: 16000, PrefillTPS: 10000, Seed: 3, Faults: faults}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// probeMain runs the probe command on a host without GPUs, so that what
// it prints does not depend on the machine the tests run on.
func probeMain(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	noGPUs := func(hclog.Logger) (gpu.Source, error) { return inspectFakeGPUs{}, gpu.ErrUnavailable }
	code = probeCmd(args, IO{In: strings.NewReader(""), Out: &out, Err: &errb}, noGPUs)
	return code, out.String(), errb.String()
}

func TestProbeJSON(t *testing.T) {
	s := probeSim(t, sim.Faults{})
	code, out, errOut := probeMain("--url", s.URL(), "--engine", "vllm", "--concurrency", "4", "--tokens", "16", "--json")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, errOut)
	}
	if errOut != "" {
		t.Errorf("--json without a terminal should keep stderr quiet, got %q", errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	for _, key := range []string{"throughput_tps", "warmup_tps", "output_tokens", "wall_seconds", "requests"} {
		if v, ok := m[key].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", key, m[key])
		}
	}
	if m["output_tokens"] != 64.0 || m["requests"] != 4.0 || m["trigger"] != "cli" || m["complete"] != true {
		t.Errorf("output_tokens %v requests %v trigger %v complete %v", m["output_tokens"], m["requests"], m["trigger"], m["complete"])
	}
}

func TestProbeHumanOutput(t *testing.T) {
	s := probeSim(t, sim.Faults{})
	code, out, errOut := probeMain("--url", s.URL(), "--concurrency", "4", "--tokens", "16", "--prompt", "count to ten")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, errOut)
	}
	for _, want := range []string{
		"waiting for " + s.URL() + " to be ready\n",
		"warm-up burst: 4 requests\n",
		"warm-up done: 4/4 requests, 64 tokens",
		"measured burst: 4 requests\n",
		"measuring done: 4/4 requests, 64 tokens",
		"throughput   ", "tok/s  (64 tokens in ",
		"warm-up      ", "measured / warm-up = ",
		"tokens       64 of 64 expected\n",
		"decode       p50 ", "first token  p50 ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\r") {
		t.Errorf("plain output must not redraw lines:\n%q", out)
	}
}

func TestProbePrefillHumanOutput(t *testing.T) {
	s := prefillProbeSim(t, sim.Faults{})
	code, out, errOut := probeMain("--url", s.URL(), "--engine", "vllm", "--concurrency", "4", "--tokens", "16",
		"--prefill", "--prefill-concurrency", "2", "--prefill-tokens", "1024")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s\n%s", code, errOut, out)
	}
	for _, want := range []string{
		"measuring done: 4/4 requests, 64 tokens",
		"prefill warm-up burst: 2 long prompts\n",
		"prefill warm-up done: 2/2 requests, 2048 prompt tokens",
		"measured prefill burst: 2 long prompts\n",
		"prefill done: 2/2 requests, 2048 prompt tokens",
		"throughput   ", "prefill      ", "tok/s  (2048 prompt tokens in ", "2 requests x 1024 tokens)",
		"  prompts    2048 of 2048 tokens expected, counted by usage\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestProbePrefillCannotMeasure(t *testing.T) {
	// The decode burst is fine; the prefill burst is served from a cache.
	// Decode steps of 100 ms make its instant answer stand out from what
	// HTTP and JSON of long prompts cost on a loaded machine under -race.
	s, err := sim.Start(sim.Config{SingleTPS: 10, Batch16TPS: 120, PrefillTPS: 50000, Faults: sim.Faults{PrefillCached: true}}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	code, out, errOut := probeMain("--url", s.URL(), "--engine", "vllm", "--concurrency", "4", "--tokens", "8",
		"--prefill", "--prefill-tokens", "2048")
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %s", code, out)
	}
	if !strings.Contains(errOut, "decode measured, prefill not (prefill_cached)") {
		t.Errorf("stderr %q", errOut)
	}
	if !strings.Contains(out, "throughput   ") || !strings.Contains(out, "prefill      not measured: prefill_cached") {
		t.Errorf("stdout %q", out)
	}
	// The engine's context decides the prompts' length: a vLLM of 1,000
	// tokens gets prompts of 1,000 − 129.
	small, err := sim.Start(sim.Config{SingleTPS: 2000, Batch16TPS: 16000, PrefillTPS: 50000, MaxModelLen: 1000}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { small.Close() })
	code, out, errOut = probeMain("--url", small.URL(), "--concurrency", "4", "--tokens", "16", "--prefill", "--json")
	var m struct {
		Prefill struct {
			PromptLength int    `json:"prompt_length"`
			Failure      string `json:"failure"`
		} `json:"prefill"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("exit %d: %v\n%s\n%s", code, err, out, errOut)
	}
	if m.Prefill.PromptLength != 1000-probe.TemplateMargin-1 {
		t.Errorf("exit %d, prompt length %d (failure %q); stderr %s", code, m.Prefill.PromptLength, m.Prefill.Failure, errOut)
	}
}

func TestProbeCannotMeasure(t *testing.T) {
	t.Run("engine ignores min_tokens", func(t *testing.T) {
		s := probeSim(t, sim.Faults{IgnoreMinTokens: true})
		code, out, errOut := probeMain("--url", s.URL(), "--engine", "vllm", "--concurrency", "4", "--tokens", "500")
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		if !strings.Contains(errOut, "could not be measured (probe_incomplete_output)") || !strings.Contains(errOut, "asked for 500") {
			t.Errorf("stderr %q", errOut)
		}
		if !strings.Contains(out, "throughput   not measured: probe_incomplete_output") {
			t.Errorf("stdout %q", out)
		}
	})
	t.Run("nothing listens", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		start := time.Now()
		code, out, errOut := probeMain("--url", "http://"+addr, "--timeout", "300ms", "--json")
		if code != 1 || !strings.Contains(errOut, "(engine_unreachable)") || !strings.Contains(errOut, "did not become ready within 300ms") {
			t.Fatalf("exit %d stderr %q", code, errOut)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil || m["failure"] != "engine_unreachable" {
			t.Errorf("JSON %v (%v)", m, err)
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("an unreachable engine held the CLI for %v", time.Since(start))
		}
	})
}

func TestProbeBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no url", nil, "--url is required"},
		{"unknown engine", []string{"--url", "http://127.0.0.1:1", "--engine", "no-such-engine"}, "not one of"},
		{"zero concurrency", []string{"--url", "http://127.0.0.1:1", "--concurrency", "0"}, "--concurrency"},
		{"negative tokens", []string{"--url", "http://127.0.0.1:1", "--tokens", "-3"}, "--tokens"},
		{"bad timeout", []string{"--url", "http://127.0.0.1:1", "--timeout", "0s"}, "--timeout"},
		{"bad wait", []string{"--url", "http://127.0.0.1:1", "--wait", "-1s"}, "--wait must be positive"},
		{"short prefill prompts", []string{"--url", "http://127.0.0.1:1", "--prefill", "--prefill-tokens", "10"}, "--prefill-tokens"},
		{"no prefill requests", []string{"--url", "http://127.0.0.1:1", "--prefill-concurrency", "0"}, "--prefill-concurrency"},
		{"not a url", []string{"--url", "ftp://127.0.0.1"}, "not an http(s) URL"},
		{"stray argument", []string{"--url", "http://127.0.0.1:1", "extra"}, "unexpected argument"},
		{"unknown flag", []string{"--fast"}, "unknown flag: --fast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := probeMain(tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) || !strings.Contains(errOut, "usage: heft-agent probe") {
				t.Fatalf("exit %d stderr %q, want 2, %q and the usage", code, errOut, tt.want)
			}
		})
	}
	if code, out, errOut := probeMain("-h"); code != 0 || errOut != "" || !strings.Contains(out, "usage: heft-agent probe") ||
		!strings.Contains(out, "--timeout DURATION") {
		t.Errorf("-h: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestProbeLiveView(t *testing.T) {
	var b bytes.Buffer
	v := &probeView{w: &b, live: true, url: "http://x"}
	for _, p := range []probe.Progress{
		{Phase: probe.PhaseWaitingReady},
		{Phase: probe.PhaseWarmup, Total: 16},
		{Phase: probe.PhaseWarmup, Done: 3, Total: 16, Tokens: 900, TPS: 450.5, Elapsed: 2 * time.Second},
		{Phase: probe.PhaseWarmup, Done: 16, Total: 16, Tokens: 2048, TPS: 385, Elapsed: 5 * time.Second},
		{Phase: probe.PhaseMeasure, Total: 16},
		{Phase: probe.PhaseMeasure, Done: 16, Total: 16, Tokens: 2048, TPS: 1200, Elapsed: 1700 * time.Millisecond},
		{Phase: probe.PhaseDone, Done: 16, Total: 16, Tokens: 2048, TPS: 1200},
	} {
		v.update(p)
	}
	v.finish()
	out := b.String()
	lines := strings.Split(out, "\n")
	if len(lines) != 3 || lines[2] != "" {
		t.Fatalf("want the two bursts on their own lines, got %q", out)
	}
	// Each line ends showing the burst's final state, redrawn in place.
	if !strings.Contains(lines[0], "\rwarm-up    16/16 requests    2048 tokens     385.0 tok/s") || !strings.Contains(lines[0], "450.5 tok/s") {
		t.Errorf("warm-up line %q", lines[0])
	}
	if last := lines[1][strings.LastIndex(lines[1], "\r")+1:]; !strings.HasPrefix(last, "measuring  16/16 requests") || !strings.Contains(last, "1200.0 tok/s") {
		t.Errorf("measure line ends with %q", last)
	}
	if logging.IsTerminal(&b) {
		t.Error("a buffer is not a terminal")
	}
}

// A probe of an engine that is down says so at once, with how long it
// will wait, and the wait is --wait, not --timeout.
func TestProbeSaysItWaitsForADownEngine(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()

	code, out, errOut := probeMain("--url", url, "--wait", "1s", "--timeout", "1h")
	want := "engine at " + url + " not ready (connection refused); waiting up to 1s more\n"
	if code != 1 || !strings.Contains(out, "waiting for "+url+" to be ready\n"+want) {
		t.Errorf("exit %d, stdout %q, want the wait announced: %q", code, out, want)
	}
	if !strings.Contains(errOut, "did not become ready within 1s") {
		t.Errorf("stderr %q", errOut)
	}

	// Under --json the notices go to stderr, and stdout stays JSON.
	code, out, errOut = probeMain("--url", url, "--wait", "1s", "--json")
	if code != 1 || !strings.HasPrefix(errOut, want) || json.Unmarshal([]byte(out), new(map[string]any)) != nil {
		t.Errorf("--json: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestProbeLiveViewWhileWaiting(t *testing.T) {
	var b bytes.Buffer
	v := &probeView{w: &b, live: true, url: "http://x"}
	v.update(probe.Progress{Phase: probe.PhaseWaitingReady})
	v.update(probe.Progress{Phase: probe.PhaseWaitingReady, Elapsed: 12300 * time.Millisecond,
		Waiting: &probe.Waiting{URL: "http://x", Reason: "connection refused", Left: 287600 * time.Millisecond}})
	v.notice(probe.Waiting{URL: "http://x", Reason: "connection refused"}) // shown in the line, not below it
	out := b.String()
	last := out[strings.LastIndex(out, "\r")+1:]
	if want := "waiting   engine not ready (connection refused)   12.3 s, up to 4m48s more"; last != want {
		t.Errorf("live line %q, want %q", last, want)
	}
}

func TestProbeLiveViewPrefill(t *testing.T) {
	var b bytes.Buffer
	v := &probeView{w: &b, live: true, url: "http://x"}
	for _, p := range []probe.Progress{
		{Phase: probe.PhaseMeasure, Done: 16, Total: 16, Tokens: 2048, TPS: 1200, Elapsed: 1700 * time.Millisecond},
		{Phase: probe.PhasePrefillWarmup, Total: 4},
		{Phase: probe.PhasePrefillWarmup, Done: 4, Total: 4, Tokens: 32768, TPS: 17001.5, Elapsed: 1900 * time.Millisecond},
		{Phase: probe.PhasePrefillMeasure, Total: 4},
		{Phase: probe.PhasePrefillMeasure, Done: 2, Total: 4, Tokens: 16384, TPS: 17580.2, Elapsed: 930 * time.Millisecond},
		{Phase: probe.PhaseDone},
	} {
		v.update(p)
	}
	v.finish()
	lines := strings.Split(b.String(), "\n")
	if len(lines) != 4 {
		t.Fatalf("want the decode and both prefill bursts on their own lines, got %q", b.String())
	}
	if !strings.Contains(lines[1], "prefill warm-up   4/4 requests   32768 prompt tokens   17001.5 tok/s") {
		t.Errorf("prefill warm-up line %q", lines[1])
	}
	if last := lines[2][strings.LastIndex(lines[2], "\r")+1:]; !strings.HasPrefix(last, "prefill     2/4 requests   16384 prompt tokens") {
		t.Errorf("prefill line ends with %q", last)
	}
}

// The probe command measures an engine as the agent does. A busy engine
// is waited for (--busy-wait, said as it waits) and, still busy, not
// measured: a burst beside other requests measures the share it got. A
// data-parallel engine gets 16 requests per rank unless --concurrency
// says otherwise.
func TestProbeMeasuresAsTheAgentDoes(t *testing.T) {
	t.Run("busy engine: not measured", func(t *testing.T) {
		s := probeSim(t, sim.Faults{})
		ctx, cancel := context.WithCancel(t.Context())
		var users sync.WaitGroup
		defer users.Wait()
		defer cancel()
		for range 2 {
			users.Go(func() {
				body := `{"messages":[{"role":"user","content":"a long answer"}],"stream":true,"max_tokens":30000,"min_tokens":30000}`
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		testutil.Eventually(t, "the users' requests to run", 10*time.Second, func() bool { r, _ := s.InFlight(); return r == 2 })
		code, out, errOut := probeMain("--url", s.URL(), "--concurrency", "4", "--tokens", "16", "--busy-wait", "1s")
		if code != 1 || !strings.Contains(errOut, "not measured: engine still busy (2 running, 0 waiting)") || strings.Contains(out, "tok/s") {
			t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
		}
		// The wait is told, as a wait for a ready engine is.
		if want := "engine at " + s.URL() + " busy (2 running, 0 waiting); waiting up to 1s more for it to be idle\n"; !strings.Contains(out, want) {
			t.Errorf("stdout %q, want the wait announced: %q", out, want)
		}
	})
	t.Run("data-parallel engine: 16 requests per rank", func(t *testing.T) {
		s, err := sim.Start(sim.Config{Flavor: sim.FlavorSGLang, DP: 2, SingleTPS: 2000, Batch16TPS: 16000, Seed: 3}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		for _, tc := range []struct {
			args     []string
			requests float64
		}{{nil, 32}, {[]string{"--concurrency", "4"}, 4}} {
			code, out, errOut := probeMain(append([]string{"--url", s.URL(), "--engine", "sglang", "--tokens", "16", "--json"}, tc.args...)...)
			var m map[string]any
			if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
				t.Fatalf("%v: exit %d\nstdout %s\nstderr %s", tc.args, code, out, errOut)
			}
			if m["requests"] != tc.requests || m["ranks"] != 2.0 {
				t.Errorf("%v: %v requests over %v ranks, want %v over 2", tc.args, m["requests"], m["ranks"], tc.requests)
			}
		}
	})
}
