package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"heft/shared/testutil"
	"heft/shared/version"
)

func TestRunServesUntilCancelled(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "sglang.log")
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr testutil.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"--flavor", "sglang", "--dp", "2", "--kv-tokens", "24094, 2925",
			"--single-tps", "60", "--batch16-tps", "600", "--log", logPath}, &stdout, &stderr)
	}()
	deadline := time.Now().Add(30 * time.Second) // generous: a loaded machine
	for !strings.HasSuffix(stdout.String(), "\n") {
		if time.Now().After(deadline) {
			t.Fatalf("no URL printed; stderr: %s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond) // poll interval while waiting for the URL line
	}
	url := strings.TrimSpace(stdout.String())
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health: %d", resp.StatusCode)
	}
	log, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(log), "DP1] KV Cache is allocated. #tokens: 2925,") {
		t.Errorf("log (%v):\n%s", err, log)
	}
	cancel()
	if c := <-code; c != 0 {
		t.Errorf("exit code %d; stderr: %s", c, stderr.String())
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"--nope"}, 2, "heft-sim: unknown flag: --nope\n\nheft-sim runs"},
		{"bad kv", []string{"--single-tps", "60", "--batch16-tps", "600", "--kv-tokens", "12k"}, 2, `"12k" is not a whole number`},
		{"extra args", []string{"serve"}, 2, `unexpected argument "serve"`},
		// A bad flag value is 2 with the usage, as on every heft binary; a
		// calibration the sim cannot simulate is 1.
		{"invalid calibration", []string{"--single-tps", "60", "--batch16-tps", "30"}, 1, "must be at least single-tps"},
		{"missing calibration", nil, 2, "--single-tps is required"},
		{"negative calibration", []string{"--single-tps", "-60", "--batch16-tps", "600"}, 2, "--single-tps is required: a positive number"},
		{"unknown flavor", []string{"--flavor", "tgi", "--single-tps", "60", "--batch16-tps", "600"}, 2, `unknown flavor "tgi"`},
		{"bad dp", []string{"--flavor", "mlx", "--dp", "2", "--single-tps", "60", "--batch16-tps", "600"}, 2, "flavor mlx has no data parallelism"},
		{"port in use", []string{"--listen", busy.Addr().String(), "--single-tps", "60", "--batch16-tps", "600"}, 1, "sim listen:"},
		{"bad cold factor", []string{"--cold-factor", "0.5", "--single-tps", "60", "--batch16-tps", "600"}, 2, "cold-factor must be a number ≥ 1, got 0.5\n\nheft-sim runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.SyncBuffer
			if c := run(t.Context(), tc.args, &stdout, &stderr); c != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", c, stderr.String(), tc.code, tc.want)
			}
			if stdout.String() != "" {
				t.Errorf("stdout %q", stdout.String())
			}
		})
	}
}

// --version is heft-sim's own version, as on every heft binary; the
// version the simulated engine reports is --engine-version. Help goes to
// stdout.
func TestVersionFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "heft-sim " + version.Version + "\n"},
		{[]string{"--help"}, "heft-sim runs a simulated inference engine"},
		{[]string{"-h"}, "--engine-version TEXT"},
	} {
		var stdout, stderr testutil.SyncBuffer
		if c := run(t.Context(), tc.args, &stdout, &stderr); c != 0 || !strings.Contains(stdout.String(), tc.want) || stderr.String() != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", tc.args, c, stdout.String(), stderr.String())
		}
	}
	cfg, _, _, ok := parseFlags([]string{"--engine-version", "0.11.2", "--single-tps", "60", "--batch16-tps", "600"}, io.Discard, io.Discard)
	if !ok || cfg.Version != "0.11.2" {
		t.Errorf("--engine-version: %+v", cfg)
	}
}

func TestPrefillFlags(t *testing.T) {
	var stderr testutil.SyncBuffer
	cfg, _, _, ok := parseFlags([]string{"--single-tps", "60", "--batch16-tps", "600", "--dp", "2", "--prefill-tps", "9000",
		"--max-batched-tokens", "4096", "--max-model-len", "32768", "--no-prefix-cache", "--report-cached-tokens",
		"--fault-truncate-prompt", "100", "--fault-prompt-usage-extra", "3", "--fault-prefill-cached", "--fault-reject-long", "2000",
		"--fault-log-kv-tokens", "24094, 2925"}, io.Discard, &stderr)
	if !ok {
		t.Fatal(stderr.String())
	}
	f := cfg.Faults
	if cfg.PrefillTPS != 9000 || cfg.MaxBatchedTokens != 4096 || cfg.MaxModelLen != 32768 || !cfg.NoPrefixCache || !cfg.ReportCachedTokens ||
		f.TruncatePrompt != 100 || f.PromptUsageExtra != 3 || !f.PrefillCached || f.RejectLong != 2000 ||
		!slices.Equal(f.LogKVTokens, []int64{24094, 2925}) {
		t.Errorf("config %+v", cfg)
	}
	var stdout testutil.SyncBuffer
	if c := run(t.Context(), []string{"-h"}, &stdout, &stderr); c != 0 || !strings.Contains(stdout.String(), "(t0 + k*b, if b > 0) + p/P") {
		t.Errorf("-h: exit %d, help %q", c, stdout.String())
	}
}

// HEFT_SIM_SLOW_FACTOR slows the sim from the start with the same command
// line; --slow-factor wins over it, and a non-number is a usage error.
func TestSlowFactorFromEnvironment(t *testing.T) {
	args := []string{"--single-tps", "60", "--batch16-tps", "600"}
	t.Setenv("HEFT_SIM_SLOW_FACTOR", "2")
	if cfg, _, _, ok := parseFlags(args, io.Discard, io.Discard); !ok || cfg.Slow.Factor != 2 || cfg.Slow.At != 0 {
		t.Errorf("from the environment: %+v ok=%v", cfg.Slow, ok)
	}
	if cfg, _, _, ok := parseFlags(append(args, "--slow-factor", "3", "--slow-at", "1m"), io.Discard, io.Discard); !ok || cfg.Slow.Factor != 3 {
		t.Errorf("the flag should win: %+v", cfg.Slow)
	}
	t.Setenv("HEFT_SIM_SLOW_FACTOR", "half")
	if _, _, code, ok := parseFlags(args, io.Discard, io.Discard); ok || code != 2 {
		t.Errorf("a non-number: ok=%v code %d", ok, code)
	}
}
