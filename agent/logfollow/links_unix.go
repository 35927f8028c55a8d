//go:build unix

package logfollow

import (
	"os"
	"syscall"
)

// linkCount returns the number of names a file has; 0 once it is deleted.
func linkCount(info os.FileInfo) (uint64, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}
