package sim

import (
	"context"
	"fmt"
	"sync"
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

// vLLM writes its stats when a step ends. In the versions of vllm issues
// #22545 and #29928, requests that were all aborted at once stayed on its
// gauges until a step ran again (Faults.StaleGaugesOnAbort); without the
// fault the gauges follow the requests.
func TestVLLMGaugesStaleOnAbort(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := Config{SingleTPS: 200, Batch16TPS: 2000, MaxRunning: 2}
				cfg.Faults.StaleGaugesOnAbort = stale
				s := bubbleSim(t, cfg)
				ctx, cancel := context.WithCancel(t.Context())
				started := make(chan struct{}, 3)
				var users sync.WaitGroup
				for range 3 { // two run, one waits
					users.Go(func() {
						resp, err := post(ctx, s.URL(), chatBody(5000, map[string]any{"ignore_eos": true, "stream": true}))
						if err == nil {
							readStream(resp, func(n int) {
								if n == 1 {
									started <- struct{}{}
								}
							})
						}
					})
				}
				<-started
				<-started
				cancel()
				users.Wait()
				synctest.Wait()
				gauges := func() (running, waiting float64) {
					mfs := scrape(t, s.URL())
					sel := map[string]string{"engine": "0"}
					return value(t, mfs, "vllm:num_requests_running", sel), value(t, mfs, "vllm:num_requests_waiting", sel)
				}
				if r, w := s.InFlight(); r+w != 0 {
					t.Fatalf("%d running and %d waiting after every client left", r, w)
				}
				wantR, wantW := 0.0, 0.0
				if stale {
					wantR, wantW = 2, 1
				}
				if r, w := gauges(); r != wantR || w != wantW {
					t.Errorf("after the aborts the gauges show %v running, %v waiting; want %v, %v", r, w, wantR, wantW)
				}
				time.Sleep(time.Minute)
				if r, w := gauges(); r != wantR || w != wantW {
					t.Errorf("a minute later the gauges show %v running, %v waiting; want %v, %v", r, w, wantR, wantW)
				}
				chat(t, s.URL(), chatBody(3, map[string]any{"min_tokens": 3}))
				if r, w := gauges(); r != 0 || w != 0 {
					t.Errorf("after a request ran its steps the gauges show %v running, %v waiting; want 0, 0", r, w)
				}
			})
		})
	}
}
