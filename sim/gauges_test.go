package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// SGLang's scheduler writes its load gauges on a prefill batch and every
// 40 decode steps, and once idle every 30 s, while /v1/loads reads the
// scheduler as it is. So its /metrics miss two requests that have just
// begun (the prefill batch that starts them writes the requests already
// decoding: none), then show them at the 40th and 80th decode steps, go
// on showing them for 30 s after they ended, and only then show none.
func TestSGLangGaugesLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bubbleSim(t, Config{Flavor: FlavorSGLang, SingleTPS: 200, Batch16TPS: 2000})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		firsts := make(chan struct{}, 2)
		dones := make(chan streamResult, 2)
		for range 2 {
			go func() {
				resp, err := post(ctx, s.URL(), chatBody(100, map[string]any{"min_tokens": 100, "ignore_eos": true, "stream": true}))
				if err != nil {
					dones <- streamResult{readErr: err}
					return
				}
				dones <- readStream(resp, func(n int) {
					if n == 1 {
						firsts <- struct{}{}
					}
				})
			}()
		}
		<-firsts
		<-firsts
		gauge := func() (running, waiting float64) {
			mfs := scrape(t, s.URL())
			return value(t, mfs, "sglang:num_running_reqs", nil), value(t, mfs, "sglang:num_queue_reqs", nil)
		}
		live := func() int {
			var got struct {
				Loads []struct {
					Running int `json:"num_running_reqs"`
				} `json:"loads"`
			}
			getJSON(t, s.URL()+"/v1/loads", &got)
			return got.Loads[0].Running
		}
		if r, _ := gauge(); r != 0 || live() != 2 {
			t.Errorf("after the first tokens: gauge %v running, /v1/loads %d; want 0 (the prefill batch's write) and 2", r, live())
		}
		for range 2 {
			if r := <-dones; r.readErr != nil || r.tokens != 100 {
				t.Fatalf("request: %d tokens, %v", r.tokens, r.readErr)
			}
		}
		synctest.Wait()
		ended := time.Now()
		if r, w := gauge(); r != 2 || w != 0 || live() != 0 {
			t.Errorf("once both ended: gauge %v running %v waiting, /v1/loads %d running; want 2, 0 (the 80th decode step's write) and 0", r, w, live())
		}
		mfs := scrape(t, s.URL())
		t0, k, _ := calibrate(200, 2000)
		if got, want := value(t, mfs, "sglang:gen_throughput", nil), 2/(t0+2*k); !exact(got, want) {
			t.Errorf("gen_throughput %v, want %v tok/s, two requests' decode steps between the two writes", got, want)
		}
		time.Sleep(29 * time.Second)
		if r, _ := gauge(); r != 2 {
			t.Errorf("29 s later the gauge shows %v running, want still 2", r)
		}
		time.Sleep(2 * time.Second)
		if r, _ := gauge(); r != 0 {
			t.Errorf("%s after the requests ended the gauge shows %v running, want 0 (the idle write)", time.Since(ended), r)
		}
	})
}
