package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"heft/shared/view"
	"heft/shared/wire"
)

// Two nodes of one vLLM DP4 deployment (--data-parallel-size 4
// --data-parallel-size-local 2), each agent reporting its own two ranks,
// and a one-node worker of the same model: the dashboard shows the
// deployment as one group spanning both nodes (heading with its ranks and
// nodes, the nodes' cards in rank order, each saying which ranks run
// there, each with the whole set's pools), and the one-node worker
// outside it.
func TestDashboardGroupsMultiNodeDeployment(t *testing.T) {
	c := startCoordinator(t)
	const model = "Qwen/Qwen3-8B"
	args := []string{"data_parallel_address=10.0.0.1", "data_parallel_rpc_port=13345", "data_parallel_size=4", "data_parallel_size_local=2"}
	node := func(name string, start int, pools ...int64) wire.Engine {
		a := args
		if start > 0 {
			a = append(append([]string{}, args...), "data_parallel_start_rank=2", "headless=true")
		}
		e := engine(name, wire.EngineVLLM, model, "0.12.0", 8000, a...)
		e.CapacityKey = name + "|vllm|dp4" // the args would make it longer than a key may be
		for i, p := range pools {
			e.Ranks = append(e.Ranks, wire.Rank{DPRank: start + i, KVTokens: p})
		}
		e.ExpectedRanks, e.Complete = 4, new(false)
		for dp := range 4 {
			if dp < start || dp >= start+2 {
				e.MissingRanks = append(e.MissingRanks, dp)
			}
		}
		return e
	}
	// Listed in the reverse of rank order, so the group must order them.
	tail, head := node("gpu-b", 2, 373600, 373552), node("gpu-a", 0, 373696, 373552)
	single := engine("gpu-c", wire.EngineVLLM, model, "0.12.0", 8000)
	single.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 379088}}
	for _, e := range []wire.Engine{tail, head, single} {
		n := e.CapacityKey[:len("gpu-a")]
		a := dialAgent(t, c, n)
		a.answer(measurement(n, e, 1000, 950))
		a.send(t, &wire.Snapshot{Node: n, Host: testHost(n), Engines: []wire.Engine{e}})
	}
	c.waitWorkers(t, "the deployment joined", func(ws []view.Worker) bool {
		joined := 0
		for _, w := range ws {
			if w.Deployment != nil && len(w.Deployment.Nodes) == 2 && len(w.Ranks) == 4 {
				joined++
			}
		}
		return joined == 2 && len(ws) == 3
	})

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	group := `.deployment[data-deployment="10.0.0.1:13345"]`
	waitJS(t, ctx, "one group with both nodes' cards", `(() => {
		const g = document.querySelector('`+group+`');
		return g && g.querySelectorAll('article.worker').length === 2;
	})()`)
	if got := eval[string](t, ctx, `document.querySelector('`+group+` h3').textContent`); !contains(got, "of 4 ranks", "across 2 nodes", "gpu-a, gpu-b", "10.0.0.1:13345") {
		t.Errorf("heading %q", got)
	}
	order := eval[[]string](t, ctx, `[...document.querySelectorAll('`+group+` article.worker')].map(c => c.dataset.workerId)`)
	if len(order) != 2 || order[0] != head.CapacityKey || order[1] != tail.CapacityKey {
		t.Errorf("cards in order %q, want gpu-a's then gpu-b's", order)
	}
	for id, want := range map[string]string{head.CapacityKey: "DP 0–1 of 4 on this node", tail.CapacityKey: "DP 2–3 of 4 on this node"} {
		if got := eval[string](t, ctx, `document.querySelector(`+jsString(card(id)+` [data-deployment-span]`)+`).textContent`); got != want {
			t.Errorf("%s: span %q, want %q", id, got, want)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll(`+jsString(card(id)+` [data-pool-rank]`)+`).length`); n != 4 {
			t.Errorf("%s: %d pools drawn, want the deployment's 4", id, n)
		}
	}
	if !eval[bool](t, ctx, `!!document.querySelector(`+jsString(`.body > .workers > `+card(single.CapacityKey))+`) && !document.querySelector(`+jsString(card(single.CapacityKey)+` [data-deployment-span]`)+`)`) {
		t.Error("the one-node worker is not shown on its own")
	}
	pageErrs.check(t)
}
