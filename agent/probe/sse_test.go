package probe

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// readAll reads every event until an error; io.EOF ends cleanly.
func readAll(in string) ([]sseEvent, error) {
	r := newSSEReader(strings.NewReader(in))
	var evs []sseEvent
	for {
		ev, err := r.Next()
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []sseEvent
		wantErr error
	}{
		{"one event", "data: {\"a\":1}\n\n", []sseEvent{{Data: `{"a":1}`}}, nil},
		{"crlf", "data: x\r\n\r\ndata: y\r\n\r\n", []sseEvent{{Data: "x"}, {Data: "y"}}, nil},
		{"no space after colon", "data:x\n\n", []sseEvent{{Data: "x"}}, nil},
		{"only one space stripped", "data:  x\n\n", []sseEvent{{Data: " x"}}, nil},
		{"multi-line data", "data: a\ndata: b\n\n", []sseEvent{{Data: "a\nb"}}, nil},
		{"empty data line", "data:\n\n", []sseEvent{{Data: ""}}, nil},
		{"comments and blank lines skipped", ": ping\n\n\n: ok\ndata: x\n\n", []sseEvent{{Data: "x"}}, nil},
		{"named event", "event: error\ndata: boom\n\n", []sseEvent{{Name: "error", Data: "boom"}}, nil},
		{"event without data is dropped", "event: x\nid: 3\n\ndata: y\n\n", []sseEvent{{Data: "y"}}, nil},
		{"id and retry ignored", "id: 1\nretry: 10\ndata: y\n\n", []sseEvent{{Data: "y"}}, nil},
		{"empty stream", "", nil, nil},
		{"line without colon", "data: x\n\nhello world\n\n", []sseEvent{{Data: "x"}}, errMalformedSSE},
		{"unknown field", "foo: bar\n\n", nil, errMalformedSSE},
		{"bare carriage return", "data: a\rdata: b\n\n", nil, errMalformedSSE},
		{"json body instead of sse", "{\"error\":\"nope\"}\n", nil, errMalformedSSE},
		{"ends inside event", "data: x\n", nil, io.ErrUnexpectedEOF},
		{"ends inside line", "data: x\n\ndata: partial", []sseEvent{{Data: "x"}}, io.ErrUnexpectedEOF},
		{"line too long", "data: " + strings.Repeat("a", maxLineBytes) + "\n\n", nil, errMalformedSSE},
		{"event too large", strings.Repeat("data: "+strings.Repeat("b", 60<<10)+"\n", 5) + "\n", nil, errMalformedSSE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readAll(tt.in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("events = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSSELongLineWithinLimit(t *testing.T) {
	// Longer than the bufio buffer, shorter than the limit: must be read whole.
	long := strings.Repeat("z", maxLineBytes-len("data: "))
	got, err := readAll("data: " + long + "\n\n")
	if err != nil || len(got) != 1 || got[0].Data != long {
		t.Fatalf("got %d events, err %v", len(got), err)
	}
}

func chunk(content string) string {
	return `data: {"choices":[{"index":0,"delta":{"content":"` + content + `"}}]}` + "\n\n"
}

func TestReadChat(t *testing.T) {
	usage := func(n string) string {
		return `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":` + n + `}}` + "\n\n"
	}
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	done := "data: [DONE]\n\n"
	tests := []struct {
		name      string
		in        string
		chunks    int
		usage     int
		hasUsage  bool
		wantErr   error
		errSubstr string
	}{
		{"three tokens with usage", role + chunk("a") + chunk("b") + chunk("c") + usage("3") + done, 3, 3, true, nil, ""},
		{"reasoning counts as text", `data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}` + "\n\n" + chunk("a") + usage("2") + done, 2, 2, true, nil, ""},
		{"no usage", chunk("a") + done, 1, 0, false, nil, ""},
		{"last usage wins", chunk("a") + `data: {"choices":[{"delta":{"content":"b"}}],"usage":{"completion_tokens":1}}` + "\n\n" + usage("2") + done, 2, 2, true, nil, ""},
		{"dropped before done", chunk("a") + chunk("b"), 2, 0, false, errDropped, ""},
		{"cut mid line", chunk("a") + `data: {"choi`, 1, 0, false, errDropped, ""},
		{"malformed json", chunk("a") + "data: {not json\n\n" + done, 1, 0, false, errMalformedSSE, ""},
		{"json array", "data: [1,2]\n\n" + done, 0, 0, false, errMalformedSSE, ""},
		{"malformed sse line", chunk("a") + "garbage\n\n" + done, 1, 0, false, errMalformedSSE, ""},
		{"error object mid-stream", chunk("a") + `data: {"error":{"message":"out of memory"}}` + "\n\n", 1, 0, false, nil, "out of memory"},
		{"error event", "event: error\ndata: overloaded\n\n", 0, 0, false, nil, "overloaded"},
		{"negative usage", `data: {"choices":[],"usage":{"completion_tokens":-4}}` + "\n\n" + done, 0, 0, false, errMalformedSSE, ""},
		{"null error is fine", `data: {"choices":[{"delta":{"content":"x"}}],"error":null}` + "\n\n" + done, 1, 0, false, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tokens := 0
			st, err := readChat(strings.NewReader(tt.in), time.Now, func(n int) { tokens += n })
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error = %v, want %v", err, tt.wantErr)
				}
			case tt.errSubstr != "":
				if err == nil || !strings.Contains(err.Error(), tt.errSubstr) {
					t.Fatalf("error = %v, want one containing %q", err, tt.errSubstr)
				}
			case err != nil:
				t.Fatalf("unexpected error %v", err)
			}
			if received := max(tt.chunks, tt.usage); st.Chunks != tt.chunks || tokens != received || st.Received != received {
				t.Errorf("chunks = %d (received %d, told %d), want %d (received %d)", st.Chunks, st.Received, tokens, tt.chunks, received)
			}
			if err == nil && (st.Usage != tt.usage || st.HasUsage != tt.hasUsage) {
				t.Errorf("usage = %d/%v, want %d/%v", st.Usage, st.HasUsage, tt.usage, tt.hasUsage)
			}
			if st.Chunks > 0 && (st.FirstToken.IsZero() || st.LastToken.Before(st.FirstToken)) {
				t.Errorf("token times %v..%v", st.FirstToken, st.LastToken)
			}
		})
	}
}

// With speculative decoding a chunk carries a step's accepted tokens.
// Asked for continuous usage, vLLM and SGLang put the tokens so far in
// every chunk, and the probe is told them as they arrive; without it,
// only the final usage makes up the chunks' shortfall.
func TestReadChatCountsTokensByUsage(t *testing.T) {
	step := func(text string, soFar int) string {
		return fmt.Sprintf(`data: {"choices":[{"index":0,"delta":{"content":%q}}],"usage":{"prompt_tokens":9,"completion_tokens":%d}}`+"\n\n", text, soFar)
	}
	final := `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7}}` + "\n\n"
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":9,"completion_tokens":0}}` + "\n\n"
	for _, tt := range []struct {
		name string
		in   string
		told []int
	}{
		{"continuous usage", role + step("a", 1) + step("bcd", 4) + step("efg", 7) + final + "data: [DONE]\n\n", []int{1, 3, 3}},
		{"final usage only", chunk("a") + chunk("bcd") + chunk("efg") + final + "data: [DONE]\n\n", []int{1, 1, 1, 4}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var told []int
			st, err := readChat(strings.NewReader(tt.in), time.Now, func(n int) { told = append(told, n) })
			if err != nil || st.Chunks != 3 || st.Usage != 7 || st.Received != 7 {
				t.Fatalf("err %v, %d chunks, usage %d, received %d", err, st.Chunks, st.Usage, st.Received)
			}
			if !reflect.DeepEqual(told, tt.told) {
				t.Errorf("told %v, want %v", told, tt.told)
			}
		})
	}
}

// encodeSSE writes events back in canonical form.
func encodeSSE(evs []sseEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Name != "" {
			b.WriteString("event: " + ev.Name + "\n")
		}
		for line := range strings.SplitSeq(ev.Data, "\n") {
			b.WriteString("data: " + line + "\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// fitsCanonical reports whether the canonical form of evs stays within
// the line limit ("data: " may be one byte longer than the "data:" read).
func fitsCanonical(evs []sseEvent) bool {
	for _, ev := range evs {
		if len("event: "+ev.Name) > maxLineBytes {
			return false
		}
		for line := range strings.SplitSeq(ev.Data, "\n") {
			if len("data: "+line) > maxLineBytes {
				return false
			}
		}
	}
	return true
}

// FuzzSSE checks that no input panics or escapes the bounds, that what the
// reader accepts survives a round trip through the canonical encoding, and
// that the chat reader built on it never panics or counts past the bytes.
func FuzzSSE(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		evs, err := readAll(string(in))
		for _, ev := range evs {
			if len(ev.Data) > maxEventBytes || len(ev.Name) > maxLineBytes {
				t.Fatalf("event beyond bounds: data %d, name %d", len(ev.Data), len(ev.Name))
			}
		}
		if err == nil && fitsCanonical(evs) {
			again, err2 := readAll(encodeSSE(evs))
			if err2 != nil {
				t.Fatalf("canonical re-encoding fails: %v", err2)
			}
			if !reflect.DeepEqual(again, evs) && !(len(again) == 0 && len(evs) == 0) {
				t.Fatalf("round trip changed events:\n%q\n%q", evs, again)
			}
		}
		st, _ := readChat(strings.NewReader(string(in)), time.Now, nil)
		if st.Chunks < 0 || st.Chunks > len(in) || st.Usage < 0 {
			t.Fatalf("impossible stats %+v from %d bytes", st, len(in))
		}
	})
}
