package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	Stream              bool          `json:"stream"`
	StreamOptions       *streamOpts   `json:"stream_options"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	NPredict            *int          `json:"n_predict"`
	MinTokens           *int          `json:"min_tokens"`
	IgnoreEOS           *bool         `json:"ignore_eos"`
}

type streamOpts struct {
	IncludeUsage *bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int   `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// words are the token pieces a response is made of, one per token.
var words = strings.Fields("the engine decodes one token per step for every running sequence and " +
	"the pool holds prompt plus generated tokens while waiting requests queue in order")

func piece(i int) string { return " " + words[i%len(words)] }

// lengthPlan is how long a response will be.
type lengthPlan struct {
	max    int
	target int
	finish string
}

func (s *Server) planLength(req *chatRequest) (lengthPlan, error) {
	var maxp *int
	var minTok int
	var ignoreEOS bool
	switch s.cfg.Flavor {
	case FlavorVLLM, FlavorSGLang:
		maxp = firstSet(req.MaxCompletionTokens, req.MaxTokens)
		if req.MinTokens != nil {
			if *req.MinTokens < 0 {
				return lengthPlan{}, fmt.Errorf("min_tokens must be non-negative, got %d", *req.MinTokens)
			}
			minTok = *req.MinTokens
		}
		ignoreEOS = req.IgnoreEOS != nil && *req.IgnoreEOS
	case FlavorLlamaCpp:
		np := req.NPredict
		if np != nil && *np < 0 { // -1 means "no limit"
			np = nil
		}
		maxp = firstSet(np, req.MaxCompletionTokens, req.MaxTokens)
		ignoreEOS = req.IgnoreEOS != nil && *req.IgnoreEOS
	case FlavorMLX:
		maxp = firstSet(req.MaxCompletionTokens, req.MaxTokens)
	case FlavorOllama:
		maxp = req.MaxTokens // max_completion_tokens is not read by Ollama
	}
	if s.cfg.Faults.IgnoreMinTokens {
		minTok, ignoreEOS = 0, false
	}
	p := lengthPlan{max: DefaultMaxTokens}
	if maxp != nil {
		if *maxp < 1 {
			return p, fmt.Errorf("max_tokens must be at least 1, got %d", *maxp)
		}
		p.max = *maxp
	}
	if ignoreEOS || minTok >= p.max {
		p.target, p.finish = p.max, "length"
		return p, nil
	}
	s.rngMu.Lock()
	natural := NaturalMin + s.rng.IntN(NaturalMax-NaturalMin)
	s.rngMu.Unlock()
	natural = max(natural, minTok)
	if natural >= p.max {
		p.target, p.finish = p.max, "length"
	} else {
		p.target, p.finish = natural, "stop"
	}
	return p, nil
}

func firstSet(vs ...*int) *int {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

// promptTokens is what the prompt costs in the pool.
func (s *Server) promptTokens(msgs []chatMessage) int64 {
	if s.cfg.PromptTokens > 0 {
		return int64(s.cfg.PromptTokens)
	}
	n := 2.0
	for _, m := range msgs {
		n += 4 + math.Ceil(1.3*float64(len(strings.Fields(messageText(m.Content)))))
	}
	return int64(n)
}

// messageText reads content that is a string or a list of text parts.
func messageText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
			b.WriteByte(' ')
		}
		return b.String()
	}
	return ""
}

func (s *Server) chatError(w http.ResponseWriter, code int, msg string) {
	switch s.cfg.Flavor {
	case FlavorVLLM, FlavorSGLang:
		typ := map[int]string{400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}[code]
		writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code})
	default:
		writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": code}})
	}
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	if n := s.chats.Add(1); s.cfg.Faults.FailEvery > 0 && n%int64(s.cfg.Faults.FailEvery) == 0 {
		s.chatError(w, http.StatusInternalServerError, fmt.Sprintf("simulated failure: every %d-th request fails", s.cfg.Faults.FailEvery))
		return
	}
	var req chatRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<20)).Decode(&req); err != nil {
		s.chatError(w, http.StatusBadRequest, "request body is not a valid chat completion request: "+err.Error())
		return
	}
	if len(req.Messages) == 0 {
		s.chatError(w, http.StatusBadRequest, "messages must be a non-empty list")
		return
	}
	if req.Model != "" && req.Model != s.cfg.Model && (s.cfg.Flavor == FlavorVLLM || s.cfg.Flavor == FlavorOllama) {
		s.chatError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	plan, err := s.planLength(&req)
	if err != nil {
		s.chatError(w, http.StatusBadRequest, err.Error())
		return
	}
	prompt := s.promptTokens(req.Messages)
	rk := s.ranks[(s.rr.Add(1)-1)%uint64(len(s.ranks))]
	if need, limit := prompt+int64(plan.max), s.seqLimit(rk); need > limit {
		s.chatError(w, http.StatusBadRequest, fmt.Sprintf(
			"request needs %d tokens of KV cache (prompt %d + max tokens %d) but DP rank %d can hold at most %d per request",
			need, prompt, plan.max, rk.idx, limit))
		return
	}
	sq := &seq{
		id:      s.ids.Add(1),
		prompt:  prompt,
		reserve: prompt + int64(plan.max),
		target:  plan.target,
		finish:  plan.finish,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	defer rk.abort(sq) // no-op once finished; frees the sequence otherwise
	rk.submit(sq)

	id := fmt.Sprintf("chatcmpl-%016x", sq.id)
	created := time.Now().Unix()
	if !req.Stream {
		select {
		case <-sq.done:
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		}
		gen, _, aborted := rk.progress(sq)
		if aborted {
			return
		}
		var text strings.Builder
		for i := range gen {
			text.WriteString(piece(i))
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": s.cfg.Model,
			"choices": []any{map[string]any{
				"index":         0,
				"message":       map[string]any{"role": "assistant", "content": text.String()},
				"logprobs":      nil,
				"finish_reason": plan.finish,
			}},
			"usage": s.usage(prompt, gen),
		})
		return
	}
	s.stream(w, r, rk, sq, plan, id, created, req.StreamOptions != nil && req.StreamOptions.IncludeUsage != nil && *req.StreamOptions.IncludeUsage)
}

func (s *Server) usage(prompt int64, gen int) usage {
	c := gen + s.cfg.Faults.UsageExtra
	return usage{PromptTokens: prompt, CompletionTokens: c, TotalTokens: prompt + int64(c)}
}

// stream writes one SSE chunk per token as the rank produces them.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, rk *rank, sq *seq, plan lengthPlan, id string, created int64, includeUsage bool) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	write := func(c chunk) {
		b, _ := json.Marshal(c)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	choice := func(d delta, finish *string) chunk {
		return chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model,
			Choices: []chunkChoice{{Delta: d, FinishReason: finish}}}
	}
	empty := ""
	write(choice(delta{Role: "assistant", Content: &empty}, nil))
	_ = rc.Flush()

	f := s.cfg.Faults
	garbleAt := max(1, plan.target/2)
	sent := 0
	for {
		select {
		case <-sq.wake:
		case <-sq.done:
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		}
		gen, over, aborted := rk.progress(sq)
		if aborted {
			return
		}
		for ; sent < gen; sent++ {
			if f.MalformedSSE && sent+1 == garbleAt {
				fmt.Fprintf(w, "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\n\n", id)
			}
			text := piece(sent)
			var fin *string
			if sent+1 == plan.target {
				fin = &plan.finish
			}
			write(choice(delta{Content: &text}, fin))
			if f.DropStreamAfter > 0 && sent+1 == f.DropStreamAfter && sent+1 < plan.target {
				_ = rc.Flush()
				rk.abort(sq)
				// Closes the connection without the terminating chunk.
				panic(http.ErrAbortHandler)
			}
		}
		_ = rc.Flush()
		if over {
			break
		}
	}
	if includeUsage {
		u := s.usage(sq.prompt, sent)
		write(chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model,
			Choices: []chunkChoice{}, Usage: &u})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
