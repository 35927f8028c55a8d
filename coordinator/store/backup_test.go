package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A backup is a whole state file that Check accepts and Open serves the
// same records from; Check refuses an empty, cut or foreign file without
// changing it.
func TestBackupAndCheck(t *testing.T) {
	b, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.SavePin("w1", 1.5); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var announced int64
	n, err := b.Backup(&buf, func(size int64) { announced = size })
	if err != nil || n != announced || int64(buf.Len()) != n {
		t.Fatalf("backup: %d bytes, announced %d, got %d, %v", n, announced, buf.Len(), err)
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, FileName)
	if err := os.WriteFile(copyPath, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(copyPath); err != nil {
		t.Fatal(err)
	}
	restored, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := restored.Load()
	restored.Close()
	if err != nil || st.Pins["w1"] != 1.5 {
		t.Errorf("restored pins %v, %v", st.Pins, err)
	}

	for name, data := range map[string][]byte{
		"empty":   {},
		"cut":     buf.Bytes()[:buf.Len()/2],
		"foreign": bytes.Repeat([]byte("x"), 8192),
	} {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Check(p); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: Check = %v, want refused", name, err)
		}
		if after, _ := os.ReadFile(p); !bytes.Equal(after, data) {
			t.Errorf("%s: Check changed the file", name)
		}
	}
}
