package web_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

var (
	screenshot = flag.String("screenshot", "", "write a 1280×900 PNG of the demo fleet's dashboard to this file (README's docs/dashboard.png)")
	variants   = flag.String("screenshot-variants", "", "also write phone-width and dark-mode PNGs into this directory")
	shotURL    = flag.String("screenshot-url", "", "shoot the dashboard of this running coordinator (e.g. `make demo`'s) instead of a scripted fleet")
)

// TestScreenshot renders the demo fleet and writes the README's screenshot.
// The README's picture is of the real `make demo` fleet:
//
//	go test ./coordinator/web -run TestScreenshot -args -screenshot ../../docs/dashboard.png -screenshot-url http://127.0.0.1:7070
func TestScreenshot(t *testing.T) {
	if *screenshot == "" && *variants == "" {
		t.Skip("no -screenshot or -screenshot-variants given")
	}
	base := *shotURL
	if base == "" {
		c := startCoordinator(t)
		startDemo(t, c, 6)
		base = c.base
	}
	ctx, pageErrs := browser(t, 1280, 900)

	full := false // the whole page, not the viewport
	shoot := func(name string, setup ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		steps := append(setup, chromedp.Navigate(base+"/"))
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		waitJS(t, ctx, "the demo fleet", `document.querySelectorAll('article[data-worker-id]').length === 4 && document.querySelector('#live').dataset.live === 'connected'`)
		capture := chromedp.CaptureScreenshot()
		if full {
			capture = chromedp.FullScreenshot(100)
		}
		png, err := chromedp.Run(ctx, capture)
		if err != nil {
			t.Fatalf("%s: screenshot: %v", name, err)
		}
		if err := os.WriteFile(name, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", name)
	}
	if *screenshot != "" {
		shoot(*screenshot)
	}
	if *variants != "" {
		if err := os.MkdirAll(*variants, 0o755); err != nil {
			t.Fatal(err)
		}
		shoot(filepath.Join(*variants, "dashboard-dark.png"), colorScheme("dark"))
		full = true
		shoot(filepath.Join(*variants, "dashboard-phone.png"), colorScheme("light"),
			chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
		shoot(filepath.Join(*variants, "dashboard-phone-dark.png"), colorScheme("dark"),
			chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
		// The whole page with the admin actions unlocked.
		shoot(filepath.Join(*variants, "dashboard-admin-full.png"), colorScheme("light"), chromedp.EmulateViewport(1280, 900))
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS("#admin-token"), adminToken),
			chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(*variants, "dashboard-admin-full.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pageErrs.check(t)
}

// colorScheme emulates the system's light or dark preference.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}},
		})
		return err
	})
}
