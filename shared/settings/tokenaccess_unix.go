//go:build unix

package settings

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// accessHint says, for a token file this process may not open, who owns
// it, its mode, and who this process runs as: the packaged services run
// as heft, so a file written by root with chmod 600 is refused. "" when
// err is not a permission error or the file cannot be looked at.
func accessHint(path string, err error) string {
	if !errors.Is(err, fs.ErrPermission) {
		return ""
	}
	self := identity{uid: os.Getuid(), gid: os.Getgid()}
	self.groups, _ = os.Getgroups()
	st, serr := os.Stat(path)
	if serr != nil {
		// The folder cannot be searched: say so of the nearest one that
		// can be looked at.
		dir := filepath.Dir(path)
		for dir != filepath.Dir(dir) {
			if dst, err := os.Stat(dir); err == nil {
				if sys, ok := dst.Sys().(*syscall.Stat_t); ok {
					return describeAccess(dir, true, owner{uid: int(sys.Uid), gid: int(sys.Gid), mode: dst.Mode().Perm()}, self)
				}
				return ""
			}
			dir = filepath.Dir(dir)
		}
		return ""
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return describeAccess(path, false, owner{uid: int(sys.Uid), gid: int(sys.Gid), mode: st.Mode().Perm()}, self)
}
