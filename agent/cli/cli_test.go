package cli

import (
	"bytes"
	"strings"
	"testing"

	"heft/shared/version"
)

// The command line behaves as on every heft binary: --version and --help
// on stdout with exit 0, mistakes on stderr with the usage and exit 2.
func TestMainCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--version"}, 0, "heft-agent " + version.Version + "\n", ""},
		{[]string{"version"}, 0, "heft-agent " + version.Version + "\n", ""},
		{[]string{"--help"}, 0, "usage: heft-agent <command>", ""},
		{[]string{"-h"}, 0, "usage: heft-agent <command>", ""},
		{[]string{"help"}, 0, "usage: heft-agent <command>", ""},
		{nil, 2, "", "heft-agent: no command given\n\nusage: heft-agent <command>"},
		{[]string{"serve"}, 2, "", "heft-agent: unknown command \"serve\"\n\nusage: heft-agent <command>"},
		{[]string{"run", "--help"}, 0, "usage: heft-agent run", ""},
		{[]string{"inspect", "--help"}, 0, "usage: heft-agent inspect", ""},
		{[]string{"run", "--bogus"}, 2, "", "heft-agent run: unknown flag: --bogus\n\nusage: heft-agent run"},
		{[]string{"version", "--help"}, 0, "usage: heft-agent version", ""},
		{[]string{"version", "x"}, 2, "", "heft-agent version: unexpected argument \"x\"\n\nusage: heft-agent version"},
		{[]string{"version", "--bogus"}, 2, "", "heft-agent version: unknown flag: --bogus\n\nusage: heft-agent version"},
	} {
		var out, errOut bytes.Buffer
		code := Main(tc.args, strings.NewReader(""), &out, &errOut)
		if code != tc.code || !strings.HasPrefix(out.String(), tc.stdout) || !strings.HasPrefix(errOut.String(), tc.stderr) ||
			(tc.stdout == "") != (out.Len() == 0) || (tc.stderr == "") != (errOut.Len() == 0) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errOut.String(),
				tc.code, tc.stdout, tc.stderr)
		}
	}
}
