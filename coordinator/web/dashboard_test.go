package web_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"heft/shared/view"
	"heft/shared/wire"
)

// pageWarning is one entry of the dashboard's warnings panel.
type pageWarning struct {
	Code     string `json:"code"`
	Worker   string `json:"worker"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

const readWarnings = `[...document.querySelectorAll('#warnings li[data-warning-code]')].map(li => ({
	code: li.dataset.warningCode, worker: li.dataset.workerId, severity: li.dataset.severity,
	message: li.querySelector('.msg').textContent }))`

const readCards = `[...document.querySelectorAll('article[data-worker-id]')].map(e => e.dataset.workerId)`

// The dashboard in a real browser against a real coordinator: every worker
// and warning shows, an admin pin goes through the UI and changes the
// weight, updates arrive without a reload, and a lost connection says so.
func TestDashboard(t *testing.T) {
	c := startCoordinator(t)
	d := startDemo(t, c, 0)
	// A second model, so the page has two sections.
	e := dialAgent(t, c, "gpu-e")
	llama := engine("gpu-e", wire.EngineVLLM, "meta-llama/Llama-3.1-8B-Instruct", "0.11.0", 8000)
	mE := measurement("gpu-e", llama, 2410, 2377)
	mE.SMClockMedianMHz = 1980
	e.answer(mE)
	e.send(t, &wire.Snapshot{Node: "gpu-e", Host: testHost("gpu-e"),
		GPUs: []wire.GPU{gpu(0, "NVIDIA H100 80GB HBM3", "GPU-e0", 79.6, 7, 1980, 1980)}, Engines: []wire.Engine{llama}})
	ws := c.waitWorkers(t, "five workers, gpu-d held", func(ws []view.Worker) bool {
		n := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted || (w.ID == d.id("gpu-d") && w.State == view.StateHeld) {
				n++
			}
		}
		return n == 5
	})

	// The API's warnings are what the page must show; make sure the fleet
	// really has the interesting ones.
	var want []pageWarning
	for _, w := range ws {
		for _, x := range w.Warnings {
			want = append(want, pageWarning{Code: x.Code, Worker: w.ID, Severity: x.Severity, Message: x.Message})
		}
	}
	for _, must := range []pageWarning{
		{Code: wire.CodeDPPoolImbalance, Worker: d.id("gpu-d")},
		{Code: wire.CodeForeignGPUProcess, Worker: d.id("gpu-d")},
		{Code: wire.CodeProbeIncompleteOutput, Worker: d.id("mac-c")},
		{Code: wire.CodeContextExceedsPool, Worker: d.id("gpu-d")},
	} {
		if !slices.ContainsFunc(want, func(p pageWarning) bool { return p.Code == must.Code && p.Worker == must.Worker }) {
			t.Fatalf("the API has no %s warning for %s: %+v", must.Code, must.Worker, want)
		}
	}

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	waitJS(t, ctx, "five worker cards and a live stream",
		`document.querySelectorAll('article[data-worker-id]').length === 5 && document.querySelector('#live').dataset.live === 'connected'`)

	t.Run("every worker", func(t *testing.T) {
		got := eval[[]string](t, ctx, readCards)
		var ids []string
		for _, w := range ws {
			ids = append(ids, w.ID)
		}
		slices.Sort(got)
		slices.Sort(ids)
		if !slices.Equal(got, ids) {
			t.Errorf("cards %q, API workers %q", got, ids)
		}
		sections := eval[[]string](t, ctx, `[...document.querySelectorAll('#models section[data-model]')].map(s => s.dataset.model)`)
		if !slices.Equal(sections, []string{"Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct"}) {
			t.Errorf("model sections %q", sections)
		}
	})

	t.Run("every warning, most severe first", func(t *testing.T) {
		got := eval[[]pageWarning](t, ctx, readWarnings)
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("warnings panel lacks %+v\npanel: %+v", w, got)
			}
		}
		if len(got) != len(want) {
			t.Errorf("panel has %d warnings, the API %d", len(got), len(want))
		}
		for i := 1; i < len(got); i++ {
			if wire.SeverityRank(got[i-1].Severity) > wire.SeverityRank(got[i].Severity) {
				t.Errorf("%s (%s) listed before %s (%s)", got[i-1].Code, got[i-1].Severity, got[i].Code, got[i].Severity)
			}
		}
	})

	t.Run("uneven pools drawn per rank", func(t *testing.T) {
		type pool struct {
			Rank  string  `json:"rank"`
			KV    string  `json:"kv"`
			Small bool    `json:"small"`
			Width float64 `json:"width"`
		}
		got := eval[[]pool](t, ctx, `[...document.querySelectorAll(`+jsString(card(d.id("gpu-d"))+` [data-pool-rank]`)+`)].map(p => ({
			rank: p.dataset.poolRank, kv: p.dataset.kvTokens, small: p.classList.contains('small'),
			width: p.querySelector('.poolbar > span').getBoundingClientRect().width / p.querySelector('.poolbar').getBoundingClientRect().width }))`)
		if len(got) != 2 || got[0].Rank != "0" || got[0].KV != "24094" || got[1].Rank != "1" || got[1].KV != "2925" {
			t.Fatalf("pools %+v", got)
		}
		if got[0].Small || !got[1].Small || got[0].Width < 0.99 || got[1].Width > 0.15 {
			t.Errorf("rank 1 should be drawn small and marked: %+v", got)
		}
		state := eval[string](t, ctx, `document.querySelector(`+jsString(card(d.id("gpu-d")))+`).dataset.state`)
		if state != view.StateHeld {
			t.Errorf("gpu-d card state %q", state)
		}
	})

	t.Run("prefill and context", func(t *testing.T) {
		type row struct {
			TPS     string `json:"tps"`
			Weight  string `json:"weight"`
			Context string `json:"context"`
			Text    string `json:"text"`
		}
		read := func(id string) row {
			return eval[row](t, ctx, `(() => { const c = document.querySelector(`+jsString(card(id))+`);
				const w = c.querySelector('[data-prefill-weight]');
				return { tps: c.querySelector('[data-prefill-tps]').dataset.prefillTps, weight: w ? w.dataset.prefillWeight : '',
					context: c.querySelector('[data-max-context]').dataset.maxContext,
					text: c.querySelector('[data-prefill-tps]').textContent + ' | ' + c.querySelector('[data-max-context]').textContent }; })()`)
		}
		str := func(p *float64) string {
			if p == nil {
				return ""
			}
			return strconv.FormatFloat(*p, 'f', -1, 64)
		}
		for _, w := range ws {
			got := read(w.ID)
			ctxWant := ""
			if w.MaxContextTokens != nil {
				ctxWant = strconv.FormatInt(*w.MaxContextTokens, 10)
			}
			if got.TPS != str(w.PrefillTPS) || got.Weight != str(w.PrefillWeight) || got.Context != ctxWant {
				t.Errorf("%s: page %+v, API prefill %s weight %s context %s", w.ID, got, str(w.PrefillTPS), str(w.PrefillWeight), ctxWant)
			}
		}
		// gpu-b reads prompts fastest of the admitted: the higher prefill
		// weight, though it decodes slower than gpu-a.
		a, b := read(d.id("gpu-a")), read(d.id("gpu-b"))
		wa, errA := strconv.ParseFloat(a.Weight, 64)
		wb, errB := strconv.ParseFloat(b.Weight, 64)
		if errA != nil || errB != nil || wa >= wb || !strings.Contains(b.Text, "14,200 prompt tok/s") {
			t.Errorf("gpu-a %+v, gpu-b %+v", a, b)
		}
		// gpu-d's small rank holds less than its model length; it is held,
		// so it has a prefill throughput but no prefill weight.
		dd := read(d.id("gpu-d"))
		if dd.Context != "2925" || !strings.Contains(dd.Text, "max model length 40,960") || dd.Weight != "" {
			t.Errorf("gpu-d %+v", dd)
		}
		if !strings.Contains(read(d.id("mac-c")).Text, "no prefill burst") {
			t.Errorf("mac-c %+v", read(d.id("mac-c")))
		}
	})

	b := card(d.id("gpu-b"))
	t.Run("admin pin", func(t *testing.T) {
		hidden := eval[bool](t, ctx, `document.querySelector(`+jsString(b+` button[data-action="pin"]`)+`).offsetParent === null`)
		if !hidden {
			t.Errorf("admin actions are visible before the admin token is entered")
		}
		// A wrong token is refused at once and unlocks nothing.
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS("#admin-token"), "not-the-token"),
			chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		); err != nil {
			t.Fatalf("enter a wrong admin token: %v", err)
		}
		waitJS(t, ctx, "the wrong token refused", `document.querySelector('#toast').textContent.includes('admin token rejected')`)
		if eval[bool](t, ctx, `document.body.classList.contains('admin') || sessionStorage.getItem('heft-admin-token') !== null`) {
			t.Errorf("a wrong admin token unlocked the admin actions")
		}
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS("#admin-token"), adminToken),
			chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		); err != nil {
			t.Fatalf("enter the admin token: %v", err)
		}
		waitJS(t, ctx, "admin actions shown", `document.querySelector(`+jsString(b+` button[data-action="pin"]`)+`).offsetParent !== null`)
		if got := eval[string](t, ctx, `sessionStorage.getItem('heft-admin-token')`); got != adminToken {
			t.Errorf("session storage holds %q", got)
		}
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(b+` input[data-pin-input]`), "1.5"),
			chromedp.Click(chromedp.CSS(b+` button[data-action="pin"]`)),
		); err != nil {
			t.Fatalf("pin: %v", err)
		}
		waitJS(t, ctx, "the pinned weight on gpu-b's card", `(() => {
			const el = document.querySelector(`+jsString(b+` [data-weight]`)+`);
			const res = document.querySelector(`+jsString(b+` [data-result]`)+`);
			return el.dataset.weight === '1.5' && el.dataset.pinned === 'true' && res.textContent.includes('pinned to 1.50');
		})()`)
		for _, w := range c.workers(t) {
			if w.ID == d.id("gpu-b") && (w.PinnedWeight == nil || *w.PinnedWeight != 1.5 || w.Weight == nil || *w.Weight != 1.5) {
				t.Errorf("the coordinator did not pin gpu-b: pinned %v, weight %v", w.PinnedWeight, w.Weight)
			}
		}
	})

	t.Run("live update without reload", func(t *testing.T) {
		eval[bool](t, ctx, `window.heftNoReload = 'still here'; true`)
		// gpu-d's operator frees the second GPU and restarts the engine:
		// the pools are even now.
		snap := d.snaps["gpu-d"]
		eng := snap.Engines[0]
		eng.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 23918}}
		snap.Engines = []wire.Engine{eng}
		snap.GPUs = []wire.GPU{snap.GPUs[0], gpu(1, "NVIDIA L4", "GPU-91c4b7e8-d1", 22.0, 0.4, 2040, 2040)}
		d.agents["gpu-d"].send(t, &snap)
		waitJS(t, ctx, "gpu-d admitted with even pools", `(() => {
			const c = document.querySelector(`+jsString(card(d.id("gpu-d")))+`);
			return c.dataset.state === 'admitted' && c.querySelector('[data-pool-rank="1"]').dataset.kvTokens === '23918' &&
				!document.querySelector('#warnings li[data-warning-code="dp_pool_imbalance"]');
		})()`)
		if got := eval[string](t, ctx, `window.heftNoReload || 'reloaded'`); got != "still here" {
			t.Errorf("the page reloaded: marker %q", got)
		}
	})

	t.Run("a throttled GPU's weight source", func(t *testing.T) {
		hot := gpu(0, "NVIDIA H100 80GB HBM3", "GPU-e0", 79.6, 7, 990, 1980)
		hot.ClockEventReasons = []string{"hw_thermal_slowdown"}
		e.send(t, &wire.Snapshot{Node: "gpu-e", Host: testHost("gpu-e"), GPUs: []wire.GPU{hot}, Engines: []wire.Engine{llama}})
		waitJS(t, ctx, "gpu-e's card says it is weighed by its clock", `(() => {
			const chip = document.querySelector(`+jsString(card(llama.CapacityKey)+` [data-source="gpu_clock"]`)+`);
			return chip !== null && chip.textContent === 'throttled' && chip.title.includes('2.00');
		})()`)
		for _, w := range c.workers(t) {
			if w.ID == llama.CapacityKey && (w.WeightSource != "gpu_clock" || w.ClockFactor != 2) {
				t.Errorf("the API: weight source %q, clock factor %v; want gpu_clock, 2", w.WeightSource, w.ClockFactor)
			}
		}
	})

	t.Run("connection lost", func(t *testing.T) {
		c.stop()
		waitJS(t, ctx, "the connection-lost indicator",
			`document.querySelector('#live').dataset.live === 'lost' && document.querySelector('#live').textContent.includes('connection lost')`)
	})
	pageErrs.check(t)
}

// 500 workers render, and the state filter narrows them down.
func TestDashboardManyWorkers(t *testing.T) {
	const (
		total     = 500
		perAgent  = wire.MaxEngines
		models    = 5
		heldEvery = 10 // every tenth worker has uneven pools and is held
	)
	c := startCoordinator(t)
	for first := 0; first < total; first += perAgent {
		node := fmt.Sprintf("node-%02d", first/perAgent)
		a := dialAgent(t, c, node)
		snap := wire.Snapshot{Node: node, Host: testHost(node),
			GPUs: []wire.GPU{gpu(0, "NVIDIA A100-SXM4-80GB", "GPU-"+node, 80, 8, 1410, 1410)}}
		for i := first; i < min(first+perAgent, total); i++ {
			e := engine(node, wire.EngineVLLM, fmt.Sprintf("org/model-%d", i%models), "0.11.0", 8000+i, fmt.Sprintf("--port=%d", 8000+i))
			e.Ranks = []wire.Rank{{DPRank: 0, KVTokens: 50000}, {DPRank: 1, KVTokens: 49000}}
			if i%heldEvery == 3 {
				e.Ranks[1].KVTokens = 9000
			}
			a.answer(measurement(node, e, 900+float64(i%7)*100, 850))
			snap.Engines = append(snap.Engines, e)
		}
		a.send(t, &snap)
	}
	c.waitWorkers(t, "500 measured workers", func(ws []view.Worker) bool {
		n := 0
		for _, w := range ws {
			if w.State == view.StateAdmitted || w.State == view.StateHeld {
				n++
			}
		}
		return n == total
	})

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	waitJS(t, ctx, "500 worker cards", `document.querySelectorAll('article[data-worker-id]').length === 500`)
	if got := eval[string](t, ctx, `document.querySelector('#count-workers').dataset.count`); got != "500" {
		t.Errorf("worker count %q", got)
	}

	filter := func(sel, value string) {
		t.Helper()
		eval[bool](t, ctx, `(() => { const s = document.querySelector(`+jsString(sel)+`);
			s.value = `+jsString(value)+`; s.dispatchEvent(new Event('change', { bubbles: true })); return s.value === `+jsString(value)+`; })()`)
	}
	const visible = `[...document.querySelectorAll('article[data-worker-id]')].filter(e => e.offsetParent !== null)`
	filter("#f-state", view.StateHeld)
	waitJS(t, ctx, "only the 50 held workers", visible+`.length === 50`)
	if bad := eval[int](t, ctx, visible+`.filter(e => e.dataset.state !== 'held').length`); bad != 0 {
		t.Errorf("%d cards shown that are not held", bad)
	}
	if got := eval[int](t, ctx, `document.querySelectorAll('#warnings li[data-warning-code="dp_pool_imbalance"]').length`); got != total/heldEvery {
		t.Errorf("%d pool warnings listed, want %d", got, total/heldEvery)
	}

	filter("#f-state", "")
	filter("#f-model", "org/model-2")
	waitJS(t, ctx, "one model's 100 workers", visible+`.length === 100`)

	// Collapsing a model's section hides its cards.
	filter("#f-model", "")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`section[data-model="org/model-0"] > h2`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "model-0 collapsed", visible+`.length === 400`)
	if !strings.Contains(eval[string](t, ctx, `document.querySelector('section[data-model="org/model-0"] > h2').getAttribute('aria-expanded')`), "false") {
		t.Errorf("collapsed section not marked aria-expanded=false")
	}
	pageErrs.check(t)
}
