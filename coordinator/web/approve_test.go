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
	"heft/shared/wire"
)

// The dashboard approves pending nodes by name pattern, then all the rest,
// each in one call.
func TestDashboardApprovesInBulk(t *testing.T) {
	c := startCoordinatorWith(t, func(cfg *config.Config) { cfg.Nodes.ApproveNew = true })
	wsURL := "ws" + strings.TrimPrefix(c.base, "http") + "/api/v1/agent"
	enrol := func(node string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + agentToken}}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		data, _ := wire.Encode(&wire.Hello{Node: node, AgentVersion: "test", Host: testHost(node), KeepsCredential: true})
		if err := conn.Write(ctx, websocket.MessageText, data); err != nil {
			t.Fatal(err)
		}
		for { // the welcome with a credential, then 4005 (pending)
			if _, _, err := conn.Read(ctx); err != nil {
				return
			}
		}
	}
	for _, n := range []string{"gpu-1", "gpu-2", "gpu-3", "db-1"} {
		enrol(n)
	}

	ctx, pageErrs := browser(t, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate(c.base+"/")); err != nil {
		t.Fatal(err)
	}
	// The node list takes a token (the admin's here: no viewer token is set).
	unlockAdmin(t, ctx)
	waitJS(t, ctx, "four pending nodes listed", `document.querySelectorAll('#pending li[data-pending-node]').length === 4`)
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#bulk-name"), "gpu-*"),
		chromedp.Click(chromedp.CSS(`#bulk-approve button[type="submit"]`)),
	); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "only db-1 left pending", `[...document.querySelectorAll('#pending li[data-pending-node]')].map(l => l.dataset.pendingNode).join() === 'db-1'`)
	waitJS(t, ctx, "the toast says three", `document.querySelector('#toast').textContent.startsWith('3 nodes approved')`)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#bulk-all`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the pending list emptied", `document.querySelector('#pending').classList.contains('hidden')`)
	pageErrs.check(t)
}
