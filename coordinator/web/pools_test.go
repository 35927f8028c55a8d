package web_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"heft/shared/view"
	"heft/shared/wire"
)

// A DP4 worker whose rank 3 has printed no pool, read from a pod's log:
// its card shows the rank without a pool, "3 of 4 ranks" and no min/max,
// and where the log is read; the warnings panel has pools_incomplete.
// Once the fourth pool arrives the card shows the ratio and the hold. A
// worker whose log cannot be read says so.
func TestDashboardIncompletePools(t *testing.T) {
	c := startCoordinator(t)
	a := dialAgent(t, c, "gpu-k")
	e := engine("gpu-k", wire.EngineVLLM, "Qwen/Qwen3-8B", "0.12.0", 8000, "data_parallel_size=4")
	e.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 373696}, {DPRank: 1, KVTokens: 373552}, {DPRank: 2, KVTokens: 373600}}
	e.ExpectedRanks, e.Complete, e.MissingRanks = 4, new(false), []int{3}
	e.RanksSource = "k8s:inference/vllm-0/vllm"
	e.LogSource = &wire.LogSource{Spec: "k8s:inference/vllm-0/vllm", Resolved: "/var/log/pods/inference_vllm-0_5f1c/vllm/0.log",
		Via: "kubelet pod log folder /var/log/pods", Wrapper: "cri", Lines: 43}
	u := engine("gpu-k", wire.EngineSGLang, "Qwen/Qwen3-8B", "0.5.4", 30000, "data_parallel_size=2")
	u.LogSource = &wire.LogSource{Spec: "journald:sglang.service", Error: "journald: no entries for unit sglang.service"}
	a.answer(measurement("gpu-k", e, 1000, 950))
	a.answer(measurement("gpu-k", u, 900, 850))
	snap := wire.Snapshot{Node: "gpu-k", Host: testHost("gpu-k"), Engines: []wire.Engine{e, u}}
	a.send(t, &snap)
	c.waitWorkers(t, "both admitted", func(ws []view.Worker) bool {
		n := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted {
				n++
			}
		}
		return n == 2
	})

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	k := card(e.CapacityKey)
	waitJS(t, ctx, "the incomplete pool set drawn", `(() => {
		const c = document.querySelector(`+jsString(k)+`);
		return c && c.querySelector('[data-pools-complete="false"]') && c.querySelector('[data-pools-incomplete="3/4"]') &&
			c.querySelector('[data-pool-rank="3"][data-pool-missing="true"]') && !c.querySelector('[data-pool-ratio]');
	})()`)
	if got := eval[string](t, ctx, `document.querySelector(`+jsString(k+` [data-pool-rank="3"]`)+`).textContent`); !contains(got, "no pool yet") {
		t.Errorf("rank 3 reads %q", got)
	}
	if got := eval[string](t, ctx, `document.querySelector(`+jsString(k+` [data-log-source]`)+`).textContent`); !contains(got, "k8s:inference/vllm-0/vllm", "0.log", "cri", "43 lines") {
		t.Errorf("log source reads %q", got)
	}
	if !eval[bool](t, ctx, `!!document.querySelector('#warnings li[data-warning-code="pools_incomplete"][data-worker-id="`+e.CapacityKey+`"]')`) {
		t.Error("no pools_incomplete in the warnings panel")
	}
	if got := eval[string](t, ctx, `document.querySelector(`+jsString(card(u.CapacityKey)+` [data-log-source]`)+`).dataset.logError`); got != "true" {
		t.Errorf("the unreadable log is not marked: %q", got)
	}
	if !eval[bool](t, ctx, `!!document.querySelector('#warnings li[data-warning-code="pools_unknown"][data-worker-id="`+u.CapacityKey+`"]')`) {
		t.Error("no pools_unknown in the warnings panel")
	}

	// Rank 3 prints its pool: an eighth of the others'.
	e.Ranks = append(e.Ranks, wire.Rank{DPRank: 3, KVTokens: 46704})
	e.Complete, e.MissingRanks = new(true), nil
	snap.Engines = []wire.Engine{e, u}
	a.send(t, &snap)
	waitJS(t, ctx, "the whole set, held", `(() => {
		const c = document.querySelector(`+jsString(k)+`);
		return c.dataset.state === 'held' && c.querySelector('[data-pools-complete="true"]') && c.querySelector('[data-pool-ratio]') &&
			!c.querySelector('[data-pool-missing]') && c.querySelector('[data-pool-rank="3"]').classList.contains('small');
	})()`)
	pageErrs.check(t)
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
