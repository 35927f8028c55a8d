package settings

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// MaxTokenFile bounds what a token file may hold; a token is one line.
const MaxTokenFile = 4096

// ReadTokenFile reads a secret from the file at path, the one way every
// heft binary does. The file must be a regular file of one non-empty line
// (surrounding space is trimmed) of at most MaxTokenFile bytes, and
// neither readable nor writable by others, nor writable by its group:
// group read is allowed so that root can own the file and the service's
// group read it (root:heft 0640).
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	// Windows has no permission bits worth checking.
	if perm := st.Mode().Perm(); runtime.GOOS != "windows" && perm&0o027 != 0 {
		return "", fmt.Errorf("%s has mode %04o, so others can read it or its group can change it; run: chmod 600 %s (or 640 with a dedicated group)",
			path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxTokenFile {
		return "", fmt.Errorf("%s is larger than %d bytes; it should hold one token", path, MaxTokenFile)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("%s holds more than one line; it should hold one token", path)
	}
	return tok, nil
}
