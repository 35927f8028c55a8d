package coord

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// dataLines reads as one event of n data lines of size bytes each.
type dataLines struct {
	n, size int
	cur     string
}

func (l *dataLines) Read(p []byte) (int, error) {
	if l.cur == "" {
		switch {
		case l.n > 0:
			l.cur = "data: " + strings.Repeat("x", l.size) + "\n"
			l.n--
		case l.n == 0:
			l.cur = "\n"
			l.n--
		default:
			return 0, io.EOF
		}
	}
	k := copy(p, l.cur)
	l.cur = l.cur[k:]
	return k, nil
}

// The scanner bounds each line to maxBody; an event of many lines is
// bounded the same, as a workers document read whole is.
func TestEventOfManyLinesIsBounded(t *testing.T) {
	ev, err := newEventReader(&dataLines{n: 3, size: 1 << 10}, nil).next()
	if err != nil || len(ev.Data) != 3<<10+2 {
		t.Fatalf("a small event: %d bytes, %v", len(ev.Data), err)
	}
	lines := maxBody>>20 + 1
	ev, err = newEventReader(&dataLines{n: lines, size: 1 << 20}, nil).next()
	if !errors.Is(err, ErrGarbage) {
		t.Fatalf("an event of %d lines of 1 MiB: %d bytes, error %v, want ErrGarbage", lines, len(ev.Data), err)
	}
}
