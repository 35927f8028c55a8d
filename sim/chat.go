package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
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
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

// usageIn says which usage a stream carries: a final chunk of it
// (include_usage, which vLLM and SGLang take as true once stream_options
// is sent), and the tokens so far in every chunk (continuous_usage_stats:
// theirs alone; vLLM's only together with include_usage).
func (s *Server) usageIn(o *streamOpts) (final, continuous bool) {
	if o == nil {
		return false, false
	}
	openAI := s.cfg.Flavor == FlavorVLLM || s.cfg.Flavor == FlavorSGLang
	final = (o.IncludeUsage == nil && openAI) || (o.IncludeUsage != nil && *o.IncludeUsage)
	continuous = openAI && o.ContinuousUsageStats != nil && *o.ContinuousUsageStats
	if s.cfg.Flavor == FlavorVLLM {
		continuous = continuous && final
	}
	return final, continuous
}

type chatMessage struct {
	Role    string         `json:"role"`
	Content messageContent `json:"content"`
}

// messageContent is a message's text: a string, or a list of text parts
// joined by spaces. Anything else reads as no text.
type messageContent string

func (c *messageContent) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = messageContent(s)
		return nil
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(b, &parts) == nil {
		var sb strings.Builder
		for _, p := range parts {
			sb.WriteString(p.Text)
			sb.WriteByte(' ')
		}
		*c = messageContent(sb.String())
		return nil
	}
	*c = ""
	return nil
}

type usage struct {
	PromptTokens        int64          `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int64          `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// llamaTimings is the timings object llama-server adds to its last chunk
// and to a whole response: prompt_n counts the prompt tokens it computed,
// cache_n those its cache served.
type llamaTimings struct {
	CacheN              int64   `json:"cache_n"`
	PromptN             int64   `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *usage        `json:"usage,omitempty"`
	Timings *llamaTimings `json:"timings,omitempty"`
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
	asked  *int // the max tokens the request named, nil if none
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
	p := lengthPlan{max: DefaultMaxTokens, asked: maxp}
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

// promptIDs is the prompt's token ids: what the tokenizer makes of the
// messages, or exactly Config.PromptTokens of them (cut, or padded with
// <|endoftext|>) when that is set.
func (s *Server) promptIDs(msgs []chatMessage) []uint32 {
	ids := chatTokens(msgs)
	if n := s.cfg.PromptTokens; n > 0 {
		for len(ids) < n {
			ids = append(ids, tokEndText)
		}
		ids = ids[:n]
	}
	return ids
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
	ids := s.promptIDs(req.Messages)
	if n := s.cfg.Faults.TruncatePrompt; n > 0 && len(ids) > n {
		ids = ids[:n]
	}
	if e := s.frontCheck(int64(len(ids)), plan.asked); e != nil {
		s.writeError(w, *e)
		return
	}
	ids = s.ollamaTruncate(ids)
	prompt := int64(len(ids))
	rk := s.ranks[(s.rr.Add(1)-1)%uint64(len(s.ranks))]
	if e := s.rankCheck(rk, prompt); e != nil {
		s.writeError(w, *e)
		return
	}
	// A sequence stops at its context's end (finish_reason "length"), and
	// admission sets aside what it may reach.
	room := max(1, s.seqLimit(rk)-prompt)
	if int64(plan.target) > room {
		plan.target, plan.finish = int(room), "length"
	}
	reserve := prompt + min(int64(plan.max), room)
	if reserve > rk.pool {
		s.chatError(w, http.StatusBadRequest, fmt.Sprintf(
			"request needs %d tokens of KV cache (prompt %d + max tokens %d) but DP rank %d can hold at most %d per request",
			reserve, prompt, reserve-prompt, rk.idx, rk.pool))
		return
	}
	sq := &seq{
		id:      s.ids.Add(1),
		tokens:  ids,
		prompt:  prompt,
		reserve: reserve,
		target:  plan.target,
		finish:  plan.finish,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	defer rk.abort(sq) // no-op once finished; frees the sequence otherwise
	// The meeting ends when the engine is done with the sequence, before
	// its last bytes go out: a client that sends its next request on them
	// must not find this one still counted as sharing the engine.
	end := sync.OnceFunc(s.meet.begin(r.Header.Get(LoadHeader)))
	defer end()
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
		p := rk.progress(sq)
		if p.aborted {
			return
		}
		end()
		var text strings.Builder
		for i := range p.gen {
			text.WriteString(piece(i))
		}
		body := map[string]any{
			"id": id, "object": "chat.completion", "created": created, "model": s.cfg.Model,
			"choices": []any{map[string]any{
				"index":         0,
				"message":       map[string]any{"role": "assistant", "content": text.String()},
				"logprobs":      nil,
				"finish_reason": plan.finish,
			}},
			"usage": s.usage(prompt, p),
		}
		if t := s.timings(prompt, p); t != nil {
			body["timings"] = t
		}
		writeJSON(w, http.StatusOK, body)
		return
	}
	final, continuous := s.usageIn(req.StreamOptions)
	s.stream(w, r, rk, sq, plan, id, created, final, continuous, end)
}

// usage is what the engine reports for a finished sequence; vLLM and
// SGLang add the cache hit when told to report it.
func (s *Server) usage(prompt int64, p seqProgress) usage {
	f := s.cfg.Faults
	c := p.gen + f.UsageExtra
	pr := prompt + int64(f.PromptUsageExtra)
	u := usage{PromptTokens: pr, CompletionTokens: c, TotalTokens: pr + int64(c)}
	if s.cfg.ReportCachedTokens && (s.cfg.Flavor == FlavorVLLM || s.cfg.Flavor == FlavorSGLang) {
		u.PromptTokensDetails = &promptDetails{CachedTokens: p.cached}
	}
	return u
}

// timings is llama-server's timings object for a finished sequence (nil
// for the other flavours).
func (s *Server) timings(prompt int64, p seqProgress) *llamaTimings {
	if s.cfg.Flavor != FlavorLlamaCpp {
		return nil
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	perToken := func(msec float64, n float64) (float64, float64) {
		if n == 0 || msec <= 0 {
			return 0, 0
		}
		return msec / n, 1000 * n / msec
	}
	t := &llamaTimings{CacheN: p.cached, PromptN: prompt - p.cached, PredictedN: p.gen}
	if !p.first.IsZero() {
		t.PromptMS = ms(p.first.Sub(p.admitted))
	}
	if !p.ended.IsZero() && !p.first.IsZero() {
		t.PredictedMS = ms(p.ended.Sub(p.first))
	}
	t.PromptPerTokenMS, t.PromptPerSecond = perToken(t.PromptMS, float64(t.PromptN))
	t.PredictedPerTokenMS, t.PredictedPerSecond = perToken(t.PredictedMS, float64(p.gen))
	return t
}

// stream writes one SSE chunk per step as the rank produces tokens, each
// with the usage so far when continuous; it calls done once the engine has
// finished the sequence, before flushing its last tokens.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, rk *rank, sq *seq, plan lengthPlan, id string, created int64, includeUsage, continuous bool, done func()) {
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
	soFar := func(c chunk, p seqProgress, sent int) chunk {
		if continuous {
			p.gen = sent
			u := s.usage(sq.prompt, p)
			c.Usage = &u
		}
		return c
	}
	empty := ""
	role := choice(delta{Role: "assistant", Content: &empty}, nil)
	if s.cfg.Flavor == FlavorVLLM {
		role = soFar(role, seqProgress{}, 0) // SGLang's come with content only
	}
	write(role)
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
		p := rk.progress(sq)
		if p.aborted {
			return
		}
		for sent < p.gen {
			// One chunk per step: a request's first token alone, then the
			// tokens each decode step gave it (rank.accept).
			n := 1
			if sent > 0 {
				n = min(rk.accept, p.gen-sent)
			}
			from := sent
			sent += n
			if f.MalformedSSE && from < garbleAt && garbleAt <= sent {
				fmt.Fprintf(w, "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\n\n", id)
			}
			var text strings.Builder
			for i := from; i < sent; i++ {
				text.WriteString(piece(i))
			}
			content := text.String()
			c := choice(delta{Content: &content}, nil)
			if sent == plan.target {
				c.Choices[0].FinishReason = &plan.finish
				c.Timings = s.timings(sq.prompt, p)
			}
			write(soFar(c, p, sent))
			if f.DropStreamAfter > 0 && from < f.DropStreamAfter && f.DropStreamAfter <= sent && sent < plan.target {
				_ = rc.Flush()
				rk.abort(sq)
				// Closes the connection without the terminating chunk.
				panic(http.ErrAbortHandler)
			}
		}
		if p.over {
			done()
		}
		_ = rc.Flush()
		if p.over {
			break
		}
	}
	if includeUsage {
		p := rk.progress(sq)
		p.gen = sent
		u := s.usage(sq.prompt, p)
		write(chunk{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model,
			Choices: []chunkChoice{}, Usage: &u})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
