package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewWritesJSONOffATerminal(t *testing.T) {
	var buf bytes.Buffer
	l := New("heft-test", "debug", false, &buf)
	l.Debug("hello", "error", "boom")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("not JSON off a terminal: %q", buf.String())
	}
	if m["@module"] != "heft-test" || m["@message"] != "hello" || m["error"] != "boom" || m["@level"] != "debug" {
		t.Errorf("line = %v", m)
	}
	buf.Reset()
	New("heft-test", "warn", true, &buf).Info("quiet")
	if buf.Len() != 0 {
		t.Errorf("an info line at level warn: %q", buf.String())
	}
	if IsTerminal(&buf) {
		t.Error("a buffer is not a terminal")
	}
}

func TestCheckLevel(t *testing.T) {
	for _, ok := range []string{"trace", "debug", "info", "warn", "error", "INFO"} {
		if err := CheckLevel(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if err := CheckLevel("loud"); err == nil || !strings.Contains(err.Error(), `log level "loud" is not one of trace, debug, info, warn, error`) {
		t.Errorf("loud: %v", err)
	}
}
