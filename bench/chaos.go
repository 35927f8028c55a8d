package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// areaChaos is area 10: the chaos test of reliability/ (TestChaos) at full
// length — Poisson load through real HAProxy and nginx in front of three
// heft-sims while each of heft's own parts fails in turn — run as
// `go test` from the source tree (the harness is the test's), its table
// read back from the file it writes. Quick mode runs the CI length.
func (e *env) areaChaos(ctx context.Context) *Section {
	s := &Section{Title: "When heft itself fails",
		Intro: "`go test ./reliability -run TestChaos -chaos.long`: three heft-sims (1,500, 1,000 and 600 tok/s alone), their heft-agents " +
			"(reaching the coordinator through a loopback proxy that can hold every byte), one heft-coordinator (offline_grace 2 s), " +
			"heft-sync, and real HAProxy (health checks, retries, redispatch, server-state-file, master-worker reloads) and nginx " +
			"(proxy_next_upstream error timeout http_502 http_503 non_idempotent, as docs/gateways.md). Poisson load of 6 requests/s through each gateway, 32 output tokens, " +
			"for a minute per fault (the network cut: held 2 minutes, load 4 minutes); the fault starts a quarter into the load.",
		Table: Table{Columns: []string{"fault", "gateway", "requests", "failed", "resent", "unfinished", "p50", "p95", "p95 vs undisturbed", "probes", "probe tokens", "note"}},
	}
	out := filepath.Join(e.work, "chaos.tsv")
	args := []string{"test", "-count=1", "-timeout", "60m", "-run", "^TestChaos$", "./reliability", "-args", "-chaos.out", out}
	if !e.opts.Quick {
		args = append(args, "-chaos.long")
	} else {
		s.Intro += " Quick mode: 6 s of load per fault, a 5 s cut."
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "HEFT_REQUIRE_GATEWAYS=1")
	t0 := time.Now()
	text, err := cmd.CombinedOutput()
	e.logf("area 10: go test ran %s", time.Since(t0).Round(time.Second))
	if err != nil {
		s.Err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tail(string(text), 3000))
	}
	data, rerr := os.ReadFile(out)
	if rerr != nil {
		if s.Err == nil {
			s.Err = rerr
		}
		return s
	}
	for line := range strings.Lines(strings.TrimSpace(string(data))) {
		s.Table.Add(strings.Split(strings.TrimRight(line, "\n"), "\t")...)
	}
	s.Notes = append(s.Notes, "failed: an error or a status other than 200; resent: sent on a kept-alive connection the gateway closed before any answer "+
		"(nginx's old workers after a reload) and sent again on a new one, as docs/gateways.md advises clients; unfinished: still open when the drain ended. "+
		"p95 is of completed requests' latency, against the same gateway's undisturbed run; the last row runs the undisturbed load again, "+
		"the spread of p95 with no fault. probes: the probe requests the coordinator sent from the phase's start until every worker was "+
		"admitted again (one started in the phase: since its start). probe tokens: what the engines generated during the phase beyond the routed load "+
		"(the agents' measurement bursts, landing on engines that serve it).")
	return s
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
