package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// The tokenizer endpoints, where the engine has one, count with the same
// tokenizer as the chat endpoint. They are honest even when a fault makes
// the chat endpoint lie, as a real engine's tokenizer would be.
//
//   - vLLM POST /tokenize: {"prompt": "..."} counts the text alone;
//     {"messages": [...]} applies the chat template (and the generation
//     prompt unless add_generation_prompt is false), so its count is the
//     chat request's usage.prompt_tokens. Answers {"count", "max_model_len",
//     "tokens", "token_strs"}.
//   - SGLang POST /tokenize and /v1/tokenize: {"prompt": "..." or [...]}
//     counts text (no chat template). Answers {"tokens", "count",
//     "max_model_len"}, lists for a list.
//   - llama.cpp POST /tokenize: {"content": "..."} answers {"tokens": [...]}.
//   - Ollama and mlx-lm have none.

type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	Content             *string         `json:"content"`
}

func (s *Server) readTokenize(w http.ResponseWriter, r *http.Request) (tokenizeRequest, bool) {
	var req tokenizeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<20)).Decode(&req); err != nil {
		s.chatError(w, http.StatusBadRequest, "request body is not a valid tokenize request: "+err.Error())
		return req, false
	}
	if req.Model != "" && req.Model != s.cfg.Model && s.cfg.Flavor == FlavorVLLM {
		s.chatError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return req, false
	}
	return req, true
}

func (s *Server) handleVLLMTokenize(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readTokenize(w, r)
	if !ok {
		return
	}
	var ids []uint32
	switch {
	case req.Messages != nil:
		ids = chatTokens(req.Messages)
		if req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			ids = ids[:len(ids)-genPrompt]
		}
	case req.Prompt != nil:
		var text string
		if err := json.Unmarshal(req.Prompt, &text); err != nil {
			s.chatError(w, http.StatusBadRequest, "prompt must be a string")
			return
		}
		ids = textTokens(nil, text)
	default:
		s.chatError(w, http.StatusBadRequest, "either prompt or messages is required")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": nonNil(ids), "token_strs": nil,
	})
}

func (s *Server) handleSGLangTokenize(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readTokenize(w, r)
	if !ok {
		return
	}
	var one string
	var many []string
	switch {
	case json.Unmarshal(req.Prompt, &one) == nil:
		ids := textTokens(nil, one)
		writeJSON(w, http.StatusOK, map[string]any{"tokens": nonNil(ids), "count": len(ids), "max_model_len": s.cfg.MaxModelLen})
	case json.Unmarshal(req.Prompt, &many) == nil:
		tokens, counts := make([][]uint32, len(many)), make([]int, len(many))
		for i, text := range many {
			tokens[i] = nonNil(textTokens(nil, text))
			counts[i] = len(tokens[i])
		}
		writeJSON(w, http.StatusOK, map[string]any{"tokens": tokens, "count": counts, "max_model_len": s.cfg.MaxModelLen})
	default:
		s.chatError(w, http.StatusBadRequest, "prompt must be a string or a list of strings")
	}
}

func (s *Server) handleLlamaTokenize(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readTokenize(w, r)
	if !ok {
		return
	}
	if req.Content == nil {
		s.chatError(w, http.StatusBadRequest, `"content" must be provided`)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": nonNil(textTokens(nil, *req.Content))})
}

// nonNil keeps an empty token list a JSON [] rather than null.
func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}
