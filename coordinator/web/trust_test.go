package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"heft/coordinator/config"
	"heft/shared/grammar"
	"heft/shared/view"
	"heft/shared/wire"
)

// Issue 16, case 8 (dashboard): free text is whatever an agent says (node
// names keep shared/grammar since, so the engine's version stands in).
// Bidi and control characters show as visible escapes, never reorder or
// hide text; the longest model name shared/grammar lets through (256
// characters) is clipped by CSS with the whole value on hover, and does
// not widen the page; the page runs under its Content-Security-Policy,
// which refuses an inline script.
func TestDashboardShowsHostileNamesSafely(t *testing.T) {
	c := startCoordinator(t)
	const width = 1280
	// U+202E (right-to-left override) makes "0.11\u202Egnp.exe" read as
	// "0.11exe.png"; U+0007 and U+200B are invisible.
	bidiVersion := "0.11\u202egnp.exe\u0007\u200b"
	longModel := strings.Repeat("m", grammar.MaxModelBytes)
	a := dialAgent(t, c, "gpu-a")
	e := engine("plain", wire.EngineVLLM, longModel, bidiVersion, 8000)
	e.CapacityKey = "plain/e0" // node|kind|model would pass the key's bound
	a.answer(measurement("gpu-a", e, 1000, 950))
	a.send(t, &wire.Snapshot{Node: "gpu-a", Host: testHost("x"), Engines: []wire.Engine{e}})
	c.waitWorkers(t, "the worker admitted", func(ws []view.Worker) bool { return len(ws) == 1 && ws[0].State == view.StateAdmitted })

	ctx, pageErrs := browser(t, width, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	waitJS(t, ctx, "the card", `document.querySelectorAll('article[data-worker-id]').length === 1`)

	type shown struct {
		Meta        string  `json:"meta"`
		ModelTitle  string  `json:"modelTitle"`
		ModelWidth  float64 `json:"modelWidth"`
		ScrollWidth float64 `json:"scrollWidth"`
		BarWidth    float64 `json:"barWidth"`
	}
	got := eval[shown](t, ctx, `(() => {
		const card = document.querySelector('article[data-worker-id]');
		const name = document.querySelector('#models h2 .name');
		return { meta: card.querySelector('.meta').textContent,
			modelTitle: name.title, modelWidth: name.getBoundingClientRect().width,
			scrollWidth: document.documentElement.scrollWidth,
			barWidth: card.querySelector('.weightbar > span').getBoundingClientRect().width };
	})()`)
	want := `vllm 0.11\u{202e}gnp.exe\u{0007}\u{200b} · `
	t.Logf("engine shown as %q; model heading %.0f px wide (title %d characters); page %.0f px wide in a %d px window",
		got.Meta, got.ModelWidth, len(got.ModelTitle), got.ScrollWidth, width)
	if !strings.HasPrefix(got.Meta, want) {
		t.Errorf("engine shown as %q, want it to start %q", got.Meta, want)
	}
	if strings.ContainsAny(got.Meta, "\u202e\u0007\u200b") {
		t.Error("a control or bidi character reached the page as itself")
	}
	if got.ModelTitle != longModel {
		t.Errorf("the model heading's title holds %d characters, want the whole %d", len(got.ModelTitle), len(longModel))
	}
	if got.ScrollWidth > width || got.ModelWidth > width {
		t.Errorf("a long model name widened the page to %.0f px (heading %.0f px)", got.ScrollWidth, got.ModelWidth)
	}
	if got.BarWidth <= 0 {
		t.Error("the weight bar has no width: bars are sized through the CSSOM under the policy")
	}
	// The policy refuses an inline script.
	ran := eval[bool](t, ctx, `(() => {
		const s = document.createElement('script');
		s.textContent = 'window.inlineRan = true';
		document.body.appendChild(s);
		return window.inlineRan === true;
	})()`)
	if ran {
		t.Error("an inline script ran: the Content-Security-Policy is not in force")
	}
	pageErrs.check(t)
}

// With approve_new_nodes the dashboard lists a node awaiting approval,
// and an admin approves it from there; the node's agent is then admitted.
func TestDashboardApprovesPendingNode(t *testing.T) {
	c := startCoordinatorWith(t, func(cfg *config.Config) { cfg.Nodes.ApproveNew = true })
	wsURL := "ws" + strings.TrimPrefix(c.base, "http") + "/api/v1/agent"
	hello := func(cred string) (*wire.Welcome, websocket.StatusCode) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		data, _ := wire.Encode(&wire.Hello{Node: "gpu-new", AgentVersion: "test", Host: testHost("gpu-new"), NodeCredential: cred, KeepsCredential: true})
		if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
			t.Fatal(err)
		}
		var welcome *wire.Welcome
		for {
			_, data, err := conn.Read(ctx)
			if err != nil {
				return welcome, websocket.CloseStatus(err)
			}
			if env, err := wire.Decode(data); err == nil && env.Type == wire.TypeWelcome {
				welcome = env.Welcome
				if cred != "" {
					return welcome, -1
				}
			}
		}
	}
	w, code := hello("")
	if w == nil || w.NodeCredential == "" || code != wire.CloseNodePending {
		t.Fatalf("a new node: welcome %+v, close %d; want a credential, then 4005", w, code)
	}

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatal(err)
	}
	// The node list needs a token (issue 25): it shows once the admin's is entered.
	unlockAdmin(t, ctx)
	waitJS(t, ctx, "the pending node listed", `document.querySelector('#pending li[data-pending-node="gpu-new"]') !== null`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#pending button[data-node-action="approve"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the pending list emptied", `document.querySelector('#pending').classList.contains('hidden')`)
	if w2, code := hello(w.NodeCredential); w2 == nil {
		t.Errorf("the approved node was refused (close %d)", code)
	}
	pageErrs.check(t)
}

// Every free text an agent sends that the dashboard shows (the engine's
// version, a GPU's name and clock reasons, a foreign process's name, the
// log source, a measurement's trigger and cause, a prefill failure) holds
// markup: it is shown as text, and no element of it reaches the page.
func TestDashboardEscapesAgentTexts(t *testing.T) {
	c := startCoordinator(t)
	const payload = `"'><b data-injected="1">x</b><i x='`
	a := dialAgent(t, c, "gpu-a")
	e := engine("gpu-a", wire.EngineVLLM, demoModel, "0.11"+payload, 8000)
	e.GPUUUIDs = []string{"GPU-a0"}
	e.LogSource = &wire.LogSource{Spec: "/var/log/" + payload, Resolved: "/var/log/x" + payload, Wrapper: "w" + payload, Error: "e" + payload}
	g := gpu(0, "H100"+payload, "GPU-a0", 80, 40, 1500, 1980)
	g.ClockEventReasons = []string{"hw_slowdown" + payload}
	g.Processes = []wire.GPUProcess{{PID: 7, Name: "p" + payload, UsedMemory: 1 << 30, Foreign: true}}
	m := measurement("gpu-a", e, 1000, 950)
	now := time.Now()
	m.Trigger, m.Cause, m.StartedAt, m.FinishedAt = "registration"+payload, "engine_restarted"+payload, now.Add(-3*time.Second), now
	m.Prefill = &wire.Prefill{Failure: "prefill_failed" + payload, Problems: []string{"why" + payload}}
	a.before(e.CapacityKey, []wire.Measurement{m})
	a.send(t, &wire.Snapshot{Node: "gpu-a", Host: testHost("gpu-a"), GPUs: []wire.GPU{g}, Engines: []wire.Engine{e}})
	c.waitWorkers(t, "the worker measured", func(ws []view.Worker) bool {
		return len(ws) == 1 && ws[0].Measurement != nil && ws[0].Measurement.Cause != ""
	})

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	waitJS(t, ctx, "the card", `document.querySelectorAll('article[data-worker-id]').length === 1`)
	type shown struct {
		Injected int    `json:"injected"`
		Titles   string `json:"titles"`
		Text     string `json:"text"`
	}
	got := eval[shown](t, ctx, `(() => {
		const card = document.querySelector('article[data-worker-id]');
		return { injected: document.querySelectorAll('[data-injected]').length,
			titles: [...card.querySelectorAll('[title]')].map(e => e.title).join('\n'),
			text: card.textContent };
	})()`)
	if got.Injected != 0 {
		t.Errorf("%d elements of an agent's text reached the page as markup; titles:\n%s", got.Injected, got.Titles)
	}
	for _, want := range []string{"registration" + payload, "engine_restarted" + payload} {
		if !strings.Contains(got.Titles, want) {
			t.Errorf("no title shows %q as text; titles:\n%s", want, got.Titles)
		}
	}
	for _, want := range []string{"0.11" + payload, "H100" + payload, "p" + payload, "/var/log/" + payload} {
		if !strings.Contains(got.Text, want) {
			t.Errorf("the card does not show %q as text", want)
		}
	}
	pageErrs.check(t)
}
