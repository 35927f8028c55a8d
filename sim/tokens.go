package sim

import "strings"

// The sim's tokenizer is deterministic and simple enough for a client to
// build a prompt of exactly L tokens: a whitespace-separated word of up to
// wordBytes bytes is one token, a longer word one token per wordBytes bytes
// (rounded up). A chat prompt wraps every message in the template Qwen3
// uses: <|im_start|>, the role, a newline, the content, <|im_end|> (4 tokens
// around the content), and ends with <|im_start|>assistant (2 tokens). So
// one user message of W short words costs W + 6 tokens.
const (
	wordBytes = 8

	vocabSize    = 151643 // ordinary token ids are below this
	tokEndText   = 151643 // <|endoftext|>, pads a prompt cut to --prompt-tokens
	tokImStart   = 151644 // <|im_start|>
	tokImEnd     = 151645 // <|im_end|>
	tokNewline   = 198    // "\n"
	perMessage   = 4      // template tokens around each message's content
	genPrompt    = 2      // <|im_start|>assistant, after the last message
	tokAssistant = 77091  // "assistant"
)

// textTokens appends the token ids of text to dst.
func textTokens(dst []uint32, text string) []uint32 {
	for w := range strings.FieldsSeq(text) {
		for len(w) > wordBytes {
			dst = append(dst, pieceID(w[:wordBytes]))
			w = w[wordBytes:]
		}
		dst = append(dst, pieceID(w))
	}
	return dst
}

// pieceID names a piece of text: its 32-bit FNV-1a hash, within the vocabulary.
func pieceID(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h % vocabSize
}

// chatTokens is the token ids of a chat prompt, template included.
func chatTokens(msgs []chatMessage) []uint32 {
	ids := make([]uint32, 0, 64)
	for _, m := range msgs {
		ids = append(ids, tokImStart, pieceID(m.Role), tokNewline)
		ids = textTokens(ids, string(m.Content))
		ids = append(ids, tokImEnd)
	}
	return append(ids, tokImStart, tokAssistant)
}
