package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// closingGateway answers the first request of each connection, keeps it
// alive, and closes it unanswered when the next request comes: what an
// nginx worker leaving after a reload does to a client that sends on its
// kept-alive connection at that instant.
func closingGateway(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				req, err := http.ReadRequest(r)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				body := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				_, _ = r.Peek(1) // the next request: close under it
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// A kept-alive connection closed under a request before any answer is
// its own failure class, and with ResendClosed the request goes again on
// another connection and completes.
func TestClosedKeptAlive(t *testing.T) {
	url := closingGateway(t)
	for _, resend := range []bool{false, true} {
		res, err := Run(context.Background(), Config{URL: url, Sequential: true, Requests: 3, Tokens: 1, Client: client(t), ResendClosed: resend})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !resend && (res.Completed != 2 || res.Errors["closed_kept_alive"] != 1 || res.Resent != 0):
			t.Errorf("without resending: %+v, want the 2nd request failed as closed_kept_alive", res)
		case resend && (res.Completed != 3 || res.Failed != 0 || res.Resent != 2):
			t.Errorf("resending: %+v, want 3 completed, the 2nd and 3rd resent (each new connection closes under its second request)", res)
		}
	}
}
