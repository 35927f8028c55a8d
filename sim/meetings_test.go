package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The counting rules alone: a load request meets another's request that
// is in flight when it starts, or that starts while it runs; each load
// request counts once; one that ends before the other starts does not.
func TestMeetingsCount(t *testing.T) {
	var m meetings
	endA := m.begin("haproxy") // alone
	endA()
	endB := m.begin("haproxy") // in flight when the probe starts
	endP := m.begin("")        // the probe
	endC := m.begin("nginx")   // starts during the probe
	endP2 := m.begin("")       // a second probe request: B and C count once
	endB()
	endC()
	endP()
	endP2()
	endD := m.begin("nginx") // after every probe ended
	endD()
	got := m.snapshot()
	want := Meetings{Load: map[string]LoadCount{"haproxy": {Requests: 2, MetOther: 1}, "nginx": {Requests: 2, MetOther: 1}}, Other: 2}
	if !equalMeetings(got, want) {
		t.Errorf("meetings %+v, want %+v", got, want)
	}
}

// Through the server: load requests alone meet nothing; a load request
// streaming while an unmarked request runs is counted, and the endpoint
// reports it.
func TestMeetingsEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := bubbleSim(t, Config{Flavor: FlavorVLLM, SingleTPS: 100, Batch16TPS: 800})
		client := clientFor(s.URL())
		chat := func(label string, tokens int) {
			body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":` + strconv.Itoa(tokens) + `,"ignore_eos":true}`
			req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/chat/completions", strings.NewReader(body))
			if label != "" {
				req.Header.Set(LoadHeader, label)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("chat: %s: %s", resp.Status, b.String())
			}
		}
		chat("gw", 4) // alone
		done := make(chan struct{})
		go func() { chat("gw", 100); close(done) }() // 100 tokens at S1: a second of the bubble's clock
		time.Sleep(100 * time.Millisecond)           // the bubble's clock: the load request is running
		chat("", 4)                                  // a probe's request meets it
		<-done
		resp, err := client.Get(s.URL() + MeetingsPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got Meetings
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		want := Meetings{Load: map[string]LoadCount{"gw": {Requests: 2, MetOther: 1}}, Other: 1}
		if !equalMeetings(got, want) {
			t.Errorf("%s: %+v, want %+v", MeetingsPath, got, want)
		}
	})
}

func equalMeetings(a, b Meetings) bool {
	if a.Other != b.Other || len(a.Load) != len(b.Load) {
		return false
	}
	for k, v := range a.Load {
		if b.Load[k] != v {
			return false
		}
	}
	return true
}
