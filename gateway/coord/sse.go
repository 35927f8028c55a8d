package coord

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// event is one server-sent event.
type event struct {
	Name string // "event:" field; "message" when absent
	Data string // "data:" lines joined by "\n"
}

// eventReader reads server-sent events. It is lenient where the format
// allows (unknown fields are ignored, as the SSE spec says) and bounds the
// size of an event, since a workers document is large but not endless.
type eventReader struct {
	sc     *bufio.Scanner
	onLine func() // called for every line, comments included: the stream is alive
}

func newEventReader(r io.Reader, onLine func()) *eventReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxBody)
	return &eventReader{sc: sc, onLine: onLine}
}

// next returns the next event that carries data, or io.EOF when the stream
// ends between events.
func (r *eventReader) next() (event, error) {
	ev := event{Name: "message"}
	var data strings.Builder
	has := false
	for r.sc.Scan() {
		if r.onLine != nil {
			r.onLine()
		}
		line := r.sc.Text()
		if line == "" {
			if has {
				ev.Data = data.String()
				return ev, nil
			}
			ev = event{Name: "message"}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			ev.Name = value
		case "data":
			if has {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			has = true
			// The scanner bounds a line; this, the event its lines make.
			if data.Len() > maxBody {
				return event{}, fmt.Errorf("%w: an event of over %d bytes", ErrGarbage, maxBody)
			}
		}
	}
	if err := r.sc.Err(); err != nil {
		return event{}, fmt.Errorf("read event stream: %w", err)
	}
	if has {
		return event{}, io.ErrUnexpectedEOF
	}
	return event{}, io.EOF
}
