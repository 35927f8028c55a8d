package main

import (
	"bytes"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("ELF binaries")
	}
	const sh = "/bin/sh" // dynamic, against glibc, on the distributions heft builds on
	var out, errs bytes.Buffer
	if code := run([]string{"--glibc-floor", sh}, &out, &errs); code != 0 || !regexp.MustCompile(`^2\.\d+(\.\d+)?\n$`).MatchString(out.String()) {
		t.Errorf("--glibc-floor %s: %d %q %q", sh, code, out.String(), errs.String())
	}
	out.Reset()
	errs.Reset()
	if code := run([]string{"--static", sh}, &out, &errs); code != 1 || !strings.Contains(errs.String(), "is not static") {
		t.Errorf("--static %s: %d %q", sh, code, errs.String())
	}
	out.Reset()
	if code := run([]string{sh}, &out, &errs); code != 0 || !strings.Contains(out.String(), "declare glibc >= ") {
		t.Errorf("%s: %d %q", sh, code, out.String())
	}
	if code := run(nil, &out, &errs); code != 2 {
		t.Errorf("no arguments: %d, want 2", code)
	}
	if code := run([]string{"--glibc-floor", sh, sh}, &out, &errs); code != 2 {
		t.Errorf("--glibc-floor with two binaries: %d, want 2", code)
	}
}
