package settings

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// MaxTokenFile bounds what a token file may hold.
const MaxTokenFile = 4096

// ReadTokensFile reads the tokens of the file at path, the one way every
// heft binary does: one token a line (surrounding space trimmed, blank
// lines skipped), at least one, in at most MaxTokenFile bytes. A file
// holds several during a rotation: the new token added below the old
// one, the old one removed once every client uses the new one. The file
// must be a regular file, neither readable nor writable by others, nor
// writable by its group: group read is allowed so that root can own the
// file and the service's group read it (root:heft 0640).
func ReadTokensFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		if hint := accessHint(path, err); hint != "" {
			return nil, fmt.Errorf("%w: %s", err, hint)
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	// Windows has no permission bits worth checking.
	if perm := st.Mode().Perm(); runtime.GOOS != "windows" && perm&0o027 != 0 {
		return nil, fmt.Errorf("%s has mode %04o, so others can read it or its group can change it; run: chmod 600 %s (or 640 with a dedicated group)",
			path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxTokenFile {
		return nil, fmt.Errorf("%s is larger than %d bytes; it should hold a token a line", path, MaxTokenFile)
	}
	toks := SplitTokens(string(data))
	if len(toks) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	for i, t := range toks {
		if strings.ContainsAny(t, " \t") {
			return nil, fmt.Errorf("%s: line %d holds a space; a token a line, nothing else", path, i+1)
		}
	}
	return toks, nil
}

// ReadTokenFile reads the token a client presents from the file at path,
// held to ReadTokensFile's rules: its last token, the newest during a
// rotation.
func ReadTokenFile(path string) (string, error) {
	toks, err := ReadTokensFile(path)
	if err != nil {
		return "", err
	}
	return toks[len(toks)-1], nil
}

// SplitTokens returns the tokens of v, one a line, trimmed, blank lines
// skipped: a token setting or file that lists several.
func SplitTokens(v string) []string {
	var out []string
	for line := range strings.Lines(v) {
		if t := strings.TrimSpace(line); t != "" {
			out = append(out, t)
		}
	}
	return out
}
