package cli

import (
	"strings"
	"testing"
)

// TestOtherPoolLinesSaysEachOnce: Ollama reads llama.cpp's lines and its
// own, so the message that lists every other kind's lines said llama.cpp's
// twice for a vLLM or SGLang log.
func TestOtherPoolLinesSaysEachOnce(t *testing.T) {
	for _, kind := range []string{"vllm", "sglang", "llamacpp", "ollama"} {
		got := otherPoolLines(kind)
		for _, line := range []string{`"GPU KV cache size: N tokens"`, `"KV Cache is allocated. #tokens: N"`, `"n_ctx = N"`, `"--ctx-size N"`} {
			if n := strings.Count(got, line); n > 1 {
				t.Errorf("kind %s: %s named %d times in %q", kind, line, n, got)
			}
		}
		if kind != "ollama" && !strings.Contains(got, `"--ctx-size N"`) {
			t.Errorf("kind %s: Ollama's own line is missing from %q", kind, got)
		}
		if kind != "sglang" && !strings.Contains(got, `"KV Cache is allocated. #tokens: N"`) {
			t.Errorf("kind %s: SGLang's line is missing from %q", kind, got)
		}
	}
}
