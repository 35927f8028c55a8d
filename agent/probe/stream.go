package probe

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// errDropped marks a stream that ended before its "[DONE]".
var errDropped = errors.New("stream ended before [DONE]")

// streamStats is what one streamed chat completion delivered.
type streamStats struct {
	// Chunks counts chunks that carried generated text (content or
	// reasoning). Engines send one per token, so it cross-checks Usage.
	Chunks int
	// Usage is completion_tokens from the last usage block, if any.
	Usage    int
	HasUsage bool
	// FirstToken and LastToken are when the first and last text chunks arrived.
	FirstToken, LastToken time.Time
}

// chatChunk is the part of an OpenAI-style chat.completion.chunk the probe
// reads. Pointers tell "absent" from "empty".
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
			Reasoning        *string `json:"reasoning"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens *int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readChat reads one streamed chat completion up to its "[DONE]". onToken
// is called for every text chunk as it arrives. Anything the probe cannot
// read (bad SSE, a chunk that is not a JSON object, an error object, a
// stream that stops early) is an error.
func readChat(r io.Reader, now func() time.Time, onToken func()) (streamStats, error) {
	var st streamStats
	sse := newSSEReader(r)
	for {
		ev, err := sse.Next()
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return st, fmt.Errorf("%w (after %d tokens)", errDropped, st.Chunks)
			}
			return st, fmt.Errorf("after %d tokens: %w", st.Chunks, err)
		}
		if ev.Name == "error" {
			return st, fmt.Errorf("engine sent an error event: %s", clip(ev.Data))
		}
		if strings.TrimSpace(ev.Data) == "[DONE]" {
			return st, nil
		}
		var c chatChunk
		if err := json.Unmarshal([]byte(ev.Data), &c); err != nil {
			return st, fmt.Errorf("%w: chunk is not a chat completion chunk: %v: %q", errMalformedSSE, err, clip(ev.Data))
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return st, fmt.Errorf("engine error in stream: %s", clip(string(c.Error)))
		}
		if c.Usage != nil && c.Usage.CompletionTokens != nil {
			if *c.Usage.CompletionTokens < 0 {
				return st, fmt.Errorf("%w: negative completion_tokens %d", errMalformedSSE, *c.Usage.CompletionTokens)
			}
			st.Usage, st.HasUsage = *c.Usage.CompletionTokens, true
		}
		for _, ch := range c.Choices {
			if nonEmpty(ch.Delta.Content) || nonEmpty(ch.Delta.ReasoningContent) || nonEmpty(ch.Delta.Reasoning) {
				t := now()
				if st.Chunks == 0 {
					st.FirstToken = t
				}
				st.LastToken = t
				st.Chunks++
				if onToken != nil {
					onToken()
				}
			}
		}
	}
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }
