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
	// reasoning). Engines send one per step: a token each, or with
	// speculative decoding the tokens a step accepted, so Usage may be
	// more than Chunks but never less.
	Chunks int
	// Usage is completion_tokens from the last usage block, if any: the
	// final one, or the tokens so far in each chunk of an engine asked
	// for continuous usage.
	Usage    int
	HasUsage bool
	// Received is the tokens received so far: Usage where it is more
	// than Chunks, else Chunks.
	Received int
	// FirstToken and LastToken are when the first and last text chunks arrived.
	FirstToken, LastToken time.Time
	// Done is when "[DONE]" arrived.
	Done time.Time
	// PromptUsage is usage.prompt_tokens from the last usage block.
	PromptUsage    int
	HasPromptUsage bool
	// Cached is the prompt tokens the engine says its cache served:
	// usage.prompt_tokens_details.cached_tokens (vLLM, SGLang when told
	// to report it) or llama.cpp's timings.cache_n.
	Cached int
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
		CompletionTokens    *int `json:"completion_tokens"`
		PromptTokens        *int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	// Timings is llama-server's: cache_n prompt tokens came from its cache.
	Timings *struct {
		CacheN *int `json:"cache_n"`
	} `json:"timings"`
	Error json.RawMessage `json:"error"`
}

// readChat reads one streamed chat completion up to its "[DONE]".
// onTokens is told each time Received grows, by how much: with
// speculative decoding a chunk carries several tokens, which only usage
// counts. Anything the probe cannot read (bad SSE, a chunk that is not a
// JSON object, an error object, a stream that stops early) is an error.
func readChat(r io.Reader, now func() time.Time, onTokens func(n int)) (streamStats, error) {
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
			st.Done = now()
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
		if err := readPromptUsage(&st, c); err != nil {
			return st, err
		}
		for _, ch := range c.Choices {
			if nonEmpty(ch.Delta.Content) || nonEmpty(ch.Delta.ReasoningContent) || nonEmpty(ch.Delta.Reasoning) {
				t := now()
				if st.Chunks == 0 {
					st.FirstToken = t
				}
				st.LastToken = t
				st.Chunks++
			}
		}
		if got := max(st.Chunks, st.Usage); got > st.Received {
			if onTokens != nil {
				onTokens(got - st.Received)
			}
			st.Received = got
		}
	}
}

// readPromptUsage takes what a chunk says about the prompt: its token
// count and the part of it a cache served.
func readPromptUsage(st *streamStats, c chatChunk) error {
	if c.Usage != nil && c.Usage.PromptTokens != nil {
		if *c.Usage.PromptTokens < 0 {
			return fmt.Errorf("%w: negative prompt_tokens %d", errMalformedSSE, *c.Usage.PromptTokens)
		}
		st.PromptUsage, st.HasPromptUsage = *c.Usage.PromptTokens, true
	}
	var cached *int
	if c.Usage != nil && c.Usage.PromptTokensDetails != nil {
		cached = c.Usage.PromptTokensDetails.CachedTokens
	}
	if c.Timings != nil && c.Timings.CacheN != nil {
		cached = c.Timings.CacheN
	}
	if cached != nil {
		if *cached < 0 {
			return fmt.Errorf("%w: negative cached prompt tokens %d", errMalformedSSE, *cached)
		}
		st.Cached = *cached
	}
	return nil
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }
