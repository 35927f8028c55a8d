package sim

import (
	"fmt"
	"net/http"
)

// How each flavour treats a prompt its context cannot hold, after the
// engines' own source:
//
//   - vLLM (entrypoints serving_engine.py, _validate_input): HTTP 400 when
//     the prompt has max_model_len tokens or more, or when prompt +
//     max_tokens exceeds it. vLLM refuses to start when one max_model_len
//     request would not fit a rank's pool (kv_cache_utils.py), so a prompt
//     that passes always fits a pool alone, and waits for room when others
//     hold it.
//   - SGLang (tokenizer_manager.py): HTTP 400 when the prompt has
//     context_length tokens or more, or prompt + max_tokens reaches it.
//     Then on the rank it was dealt to (scheduler.py, validate_input_length):
//     a prompt of min(context_length, pool) − 1 tokens or more is aborted,
//     "Input length (...) exceeds the maximum allowed length" (unless
//     --allow-auto-truncate). A prompt that passes waits for room.
//   - llama.cpp (server-context.cpp): HTTP 400 exceed_context_size_error
//     when the prompt has a slot's n_ctx tokens or more; generation stops at
//     the slot's end with finish_reason "length".
//   - Ollama (runner, truncate defaults to true): a prompt longer than the
//     context is cut silently to its first 4 tokens and its last ones, and
//     usage reports the cut length; the sim keeps one token of room for the
//     answer, where Ollama would shift its context.
//   - mlx-lm checks nothing; the sim refuses a prompt its pool cannot hold.

// apiError is an error answer, written in the flavour's shape.
type apiError struct {
	status  int
	message string
	typ     string         // "" = the flavour's usual type for status
	extra   map[string]any // more fields of llama.cpp's error object
}

func (s *Server) writeError(w http.ResponseWriter, e apiError) {
	switch s.cfg.Flavor {
	case FlavorVLLM, FlavorSGLang:
		typ := e.typ
		if typ == "" {
			typ = map[int]string{400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}[e.status]
		}
		if s.cfg.Flavor == FlavorSGLang {
			writeJSON(w, e.status, map[string]any{"object": "error", "message": e.message, "type": typ, "param": nil, "code": e.status})
			return
		}
		// vLLM since 0.10 nests the error like OpenAI (ErrorResponse{error: ErrorInfo}).
		writeJSON(w, e.status, map[string]any{"error": map[string]any{"message": e.message, "type": typ, "param": nil, "code": e.status}})
	default:
		typ := e.typ
		if typ == "" {
			typ = "invalid_request_error"
		}
		obj := map[string]any{"message": e.message, "type": typ, "code": e.status}
		for k, v := range e.extra {
			obj[k] = v
		}
		writeJSON(w, e.status, map[string]any{"error": obj})
	}
}

func (s *Server) chatError(w http.ResponseWriter, code int, msg string) {
	s.writeError(w, apiError{status: code, message: msg})
}

// contextError is the flavour's answer to a prompt of n tokens that its
// context of limit tokens cannot take.
func (s *Server) contextError(n, limit int64) apiError {
	e := apiError{status: http.StatusBadRequest}
	switch s.cfg.Flavor {
	case FlavorVLLM:
		e.message = fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
			"Please reduce the length of the input messages.", limit, n)
	case FlavorSGLang:
		e.message = fmt.Sprintf("The input (%d tokens) is longer than the model's context length (%d tokens).", n, limit)
	case FlavorLlamaCpp:
		e.message = fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it", n, limit)
		e.typ = "exceed_context_size_error"
		e.extra = map[string]any{"n_prompt_tokens": n, "n_ctx": limit}
	default: // Ollama with truncate off; mlx-lm has no such check, the words are the sim's
		e.message = fmt.Sprintf("the input length (%d tokens) exceeds the context length (%d tokens)", n, limit)
	}
	return e
}

// frontCheck is what the engine's front end checks of a prompt of n tokens
// before it is dealt to a rank; maxTokens is the request's cap, nil when
// it names none.
func (s *Server) frontCheck(n int64, maxTokens *int) *apiError {
	fail := func(e apiError) *apiError { return &e }
	if f := int64(s.cfg.Faults.RejectLong); f > 0 && n > f {
		return fail(s.contextError(n, f))
	}
	limit := s.cfg.MaxModelLen
	switch s.cfg.Flavor {
	case FlavorVLLM:
		if n >= limit {
			return fail(s.contextError(n, limit))
		}
		if maxTokens != nil && n+int64(*maxTokens) > limit {
			return fail(apiError{status: http.StatusBadRequest, message: fmt.Sprintf(
				"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
					"and your request has %d input tokens (%d > %d - %d).", *maxTokens, limit, n, *maxTokens, limit, n)})
		}
	case FlavorSGLang:
		if n >= limit {
			return fail(s.contextError(n, limit))
		}
		if maxTokens != nil && n+int64(*maxTokens) >= limit {
			return fail(apiError{status: http.StatusBadRequest, message: fmt.Sprintf(
				"Requested token count exceeds the model's maximum context length of %d tokens. You requested a total of "+
					"%d tokens: %d tokens from the input messages and %d tokens for the completion. Please reduce the number "+
					"of tokens in the input messages or the completion to fit within the limit.",
				limit, n+int64(*maxTokens), n, *maxTokens)})
		}
	case FlavorLlamaCpp:
		if slot := s.llamaSlotCtx(); n >= slot {
			return fail(s.contextError(n, slot))
		}
	}
	return nil
}

// rankCheck is what the rank a prompt of n tokens was dealt to checks.
func (s *Server) rankCheck(r *rank, n int64) *apiError {
	switch s.cfg.Flavor {
	case FlavorSGLang:
		if most := min(s.cfg.MaxModelLen, r.pool) - 1; n >= most {
			return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(
				"Input length (%d tokens) exceeds the maximum allowed length (%d tokens). "+
					"Use a shorter input or enable --allow-auto-truncate.", n, most)}
		}
	case FlavorMLX:
		if n >= r.pool {
			e := s.contextError(n, r.pool)
			return &e
		}
	}
	return nil
}

// seqLimit is the most prompt + generated tokens one sequence may reach on
// rank r.
func (s *Server) seqLimit(r *rank) int64 { return s.cfg.seqLimit(r.pool) }

// seqLimit is the most prompt + generated tokens one sequence may reach on
// a rank of this pool: vLLM's max_model_len, SGLang's context_length or
// pool, a llama.cpp slot's n_ctx, the pool elsewhere. c is normalized.
func (c Config) seqLimit(pool int64) int64 {
	switch c.Flavor {
	case FlavorVLLM:
		return c.MaxModelLen
	case FlavorSGLang:
		return min(c.MaxModelLen, pool)
	case FlavorLlamaCpp:
		return pool / int64(c.MaxRunning)
	}
	return pool
}

// ollamaTruncate cuts a prompt longer than Ollama's context the way its
// runner does: the first 4 tokens and the newest ones.
func (s *Server) ollamaTruncate(ids []uint32) []uint32 {
	const keep = 4
	limit := int(s.ranks[0].pool) - 1 // one token of room for the answer
	if s.cfg.Flavor != FlavorOllama || len(ids) <= limit || limit <= keep {
		return ids
	}
	return append(ids[:keep:keep], ids[len(ids)-(limit-keep):]...)
}
