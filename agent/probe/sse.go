package probe

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"heft/shared/wire"
)

// Bounds on what one engine stream may send. A chat chunk is a few hundred
// bytes; anything near these limits is a broken or hostile engine, and the
// probe must not grow without bound reading it.
const (
	maxLineBytes  = 64 << 10
	maxEventBytes = 256 << 10
)

// errMalformedSSE wraps every violation of the event-stream format.
var errMalformedSSE = errors.New("malformed event stream")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	Name string // from "event:"; "" for the default "message"
	Data string // "data:" lines joined by "\n"
}

// sseReader reads server-sent events strictly: a line that is not a
// comment, a blank line or one of the four known fields is an error, not
// skipped, because a probe that skips what it cannot read would count
// tokens it never saw the shape of.
type sseReader struct {
	r    *bufio.Reader
	line int
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 4096)}
}

// Next returns the next event that carries data. It returns io.EOF at a
// clean end between events and io.ErrUnexpectedEOF when the stream stops
// inside an event or a line.
func (s *sseReader) Next() (sseEvent, error) {
	var (
		ev      sseEvent
		data    strings.Builder
		hasData bool
	)
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && hasData {
				return sseEvent{}, io.ErrUnexpectedEOF
			}
			return sseEvent{}, err
		}
		if line == "" {
			if hasData {
				ev.Data = data.String()
				return ev, nil
			}
			// An event without data is not dispatched (as in the SSE spec).
			ev = sseEvent{}
			continue
		}
		if line[0] == ':' {
			continue // comment, e.g. ": ping"
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			return sseEvent{}, fmt.Errorf("%w: line %d has no field name: %q", errMalformedSSE, s.line, clip(line))
		}
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			if data.Len()+len(value) > maxEventBytes {
				return sseEvent{}, fmt.Errorf("%w: event over %d bytes", errMalformedSSE, maxEventBytes)
			}
			data.WriteString(value)
			hasData = true
		case "event":
			ev.Name = value
		case "id", "retry":
			// Reconnection hints; a probe never reconnects a stream.
		default:
			return sseEvent{}, fmt.Errorf("%w: line %d has unknown field %q", errMalformedSSE, s.line, clip(name))
		}
	}
}

// readLine returns one line without its "\n" or "\r\n", refusing lines
// longer than maxLineBytes and bare carriage returns.
func (s *sseReader) readLine() (string, error) {
	var buf []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(buf)+len(frag) > maxLineBytes+2 {
			return "", fmt.Errorf("%w: line %d is over %d bytes", errMalformedSSE, s.line+1, maxLineBytes)
		}
		buf = append(buf, frag...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if len(buf) > 0 {
				return "", io.ErrUnexpectedEOF // a line without its newline
			}
			return "", io.EOF
		}
		if err != nil {
			return "", err
		}
		break
	}
	s.line++
	buf = buf[:len(buf)-1]
	if n := len(buf); n > 0 && buf[n-1] == '\r' {
		buf = buf[:n-1]
	}
	line := string(buf)
	if strings.IndexByte(line, '\r') >= 0 {
		return "", fmt.Errorf("%w: line %d holds a bare carriage return", errMalformedSSE, s.line)
	}
	return line, nil
}

// clip shortens s for an error message.
func clip(s string) string { return wire.Clip(s, 120) }
