package fleet

import (
	"strings"
	"testing"
)

func TestClipProblems(t *testing.T) {
	var ps []string
	for i := 0; i < 64; i++ {
		ps = append(ps, strings.Repeat("é", 4096)) // 2 bytes a rune: cuts must keep UTF-8 valid
	}
	got := clipProblems(ps)
	if len(got) != viewProblems+1 || got[viewProblems] != "(56 more)" {
		t.Fatalf("got %d problems, last %q", len(got), got[len(got)-1])
	}
	for _, p := range got[:viewProblems] {
		if len(p) > viewProblemBytes+len("…") || !strings.HasSuffix(p, "…") || strings.ToValidUTF8(p, "?") != p {
			t.Errorf("problem of %d bytes", len(p))
		}
	}
	if short := clipProblems([]string{"a", "b"}); len(short) != 2 || short[1] != "b" {
		t.Errorf("short list changed: %q", short)
	}
}
