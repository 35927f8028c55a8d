package settings

import (
	"fmt"
	"io/fs"
	"os/user"
	"strconv"
	"strings"
)

// owner is a file's owner, group and mode.
type owner struct {
	uid, gid int
	mode     fs.FileMode
}

// identity is who a process runs as.
type identity struct {
	uid, gid int
	groups   []int
}

// describeAccess writes the hint for a token file (or, dir true, the
// folder holding it) this process may not read: the owner, group and
// mode, this process's user and groups, and the commands that let it.
func describeAccess(path string, dir bool, o owner, self identity) string {
	what, need, mode := "the file", "read", "640"
	if dir {
		what, need, mode = "its folder "+path, "enter", "750"
	}
	var groups []string
	for _, g := range self.groups {
		groups = append(groups, groupName(g))
	}
	if len(groups) == 0 {
		groups = []string{groupName(self.gid)}
	}
	return fmt.Sprintf("%s is owned by %s, group %s, mode %04o, and this process runs as %s, groups %s, so it cannot %s it; "+
		"give that group access: chgrp %s %s && chmod %s %s (the packaged services run as heft)",
		what, userName(o.uid), groupName(o.gid), o.mode, userName(self.uid), strings.Join(groups, ","), need,
		groupName(self.gid), path, mode, path)
}

func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return "uid " + strconv.Itoa(uid)
}

func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return "gid " + strconv.Itoa(gid)
}
