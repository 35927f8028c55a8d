package settings

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// syncConfig is a toy heft-sync: a [coordinator] table, a secret with a
// file alternative, and arrays of tables of two kinds, one with a
// duration, as the gateway issue will need.
type syncConfig struct {
	Coordinator struct {
		URL       string
		Token     string
		TokenFile string
	}
	Interval time.Duration
	LogJSON  bool
	Check    bool
	Weight   float64
	HAProxy  []haproxy
	Nginx    []nginx
}

type haproxy struct {
	Model, Socket, Backend string
	Drain                  time.Duration
}

type nginx struct {
	Model, File, Reload string
	Directives          []string
}

func syncDefault() syncConfig {
	var c syncConfig
	c.Interval = 5 * time.Second
	c.Weight = 1
	return c
}

func (c *syncConfig) command() Command {
	return Command{
		Name:      "heft-sync",
		Synopsis:  "heft-sync [--config FILE] [flags]",
		EnvPrefix: "HEFT_SYNC_",
		Version:   true,
		Settings: []Setting{
			String("coordinator.url", &c.Coordinator.URL, "coordinator URL").Flag("coordinator").Meta("URL"),
			String("coordinator.token", &c.Coordinator.Token, "token").Secret().Flag("-").Env("HEFT_SYNC_TOKEN"),
			String("coordinator.token_file", &c.Coordinator.TokenFile, "token file").Flag("token-file").Env("HEFT_SYNC_TOKEN_FILE").Meta("FILE"),
			Duration("interval", &c.Interval, "how often to sync"),
			Bool("log_json", &c.LogJSON, "log JSON"),
			Bool("check", &c.Check, "check and exit").FlagOnly(),
			Float("weight", &c.Weight, "a number"),
			List("haproxy", &c.HAProxy, "an haproxy backend", ListOf[haproxy]{Fields: func(h *haproxy) []Setting {
				return []Setting{
					String("model", &h.Model, "model"),
					String("socket", &h.Socket, "admin socket"),
					String("backend", &h.Backend, "backend"),
					Duration("drain", &h.Drain, "drain time"),
				}
			}}),
			List("nginx", &c.Nginx, "an nginx upstream file", ListOf[nginx]{
				Fields: func(n *nginx) []Setting {
					return []Setting{String("model", &n.Model, "model"), String("file", &n.File, "file"), String("reload", &n.Reload, "reload command"),
						Strings("directives", &n.Directives, "upstream directives")}
				},
				New: func() nginx { return nginx{Reload: "nginx -s reload"} },
			}),
		},
		Alternatives: [][]string{{"coordinator.token", "coordinator.token_file"}},
	}
}

func writeFile(t *testing.T, name, text string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

const syncTOML = `interval = "30s"
[coordinator]
url = "http://127.0.0.1:7070"
token = "from-file"
[[haproxy]]
model = "qwen"
socket = "/run/haproxy.sock"
backend = "qwen_pool"
drain = "10s"
[[haproxy]]
model = "llama"
socket = "/run/haproxy.sock"
backend = "llama_pool"
[[nginx]]
model = "qwen"
file = "/etc/nginx/heft.conf"
directives = ["least_conn", "keepalive 32"]
`

func TestArraysOfTablesFromFile(t *testing.T) {
	c := syncDefault()
	rep, err := c.command().Load(writeFile(t, "sync.toml", syncTOML, 0o600), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != 30*time.Second || c.Coordinator.URL != "http://127.0.0.1:7070" || c.Weight != 1 {
		t.Errorf("got %+v", c)
	}
	want := []haproxy{{"qwen", "/run/haproxy.sock", "qwen_pool", 10 * time.Second}, {"llama", "/run/haproxy.sock", "llama_pool", 0}}
	if len(c.HAProxy) != 2 || c.HAProxy[0] != want[0] || c.HAProxy[1] != want[1] {
		t.Errorf("haproxy = %+v", c.HAProxy)
	}
	if len(c.Nginx) != 1 || c.Nginx[0].Model != "qwen" || c.Nginx[0].File != "/etc/nginx/heft.conf" || c.Nginx[0].Reload != "nginx -s reload" ||
		!slices.Equal(c.Nginx[0].Directives, []string{"least_conn", "keepalive 32"}) {
		t.Errorf("nginx = %+v (the entry's default reload is lost?)", c.Nginx)
	}
	if o, _ := rep.Origin("haproxy"); o.Source != FromFile {
		t.Errorf("haproxy origin = %v", o)
	}
	if o, _ := rep.Origin("weight"); o.Source != FromDefault {
		t.Errorf("weight origin = %v", o)
	}
}

func TestLayersAndOrigins(t *testing.T) {
	path := writeFile(t, "sync.toml", syncTOML, 0o600)
	tokFile := writeFile(t, "tok", "t\n", 0o600)
	c := syncDefault()
	rep, err := c.command().Load("", []string{
		"--config", path,
		"--interval", "1m",
		"--haproxy", "model=a,socket=/s,backend=b,drain=2s",
		"--haproxy", "model=c,socket=/s,backend=d",
		"--log-json",
		"--check",
	}, envOf(map[string]string{
		"HEFT_SYNC_INTERVAL":   "10s",
		"HEFT_SYNC_WEIGHT":     "2.5",
		"HEFT_SYNC_TOKEN_FILE": tokFile,
		"HEFT_SYNC_NGINX":      "model=x,file=/a; model=y,file=/b,reload=systemctl reload nginx",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != time.Minute || c.Weight != 2.5 || !c.LogJSON || !c.Check {
		t.Errorf("got %+v", c)
	}
	// A token file in the environment replaces the file's token.
	if c.Coordinator.Token != "" || c.Coordinator.TokenFile != tokFile {
		t.Errorf("coordinator = %+v", c.Coordinator)
	}
	if len(c.HAProxy) != 2 || c.HAProxy[0] != (haproxy{"a", "/s", "b", 2 * time.Second}) || c.HAProxy[1].Model != "c" {
		t.Errorf("flags did not replace the file's haproxy: %+v", c.HAProxy)
	}
	if len(c.Nginx) != 2 || c.Nginx[0].File != "/a" || c.Nginx[0].Reload != "nginx -s reload" || c.Nginx[1].Reload != "systemctl reload nginx" {
		t.Errorf("env did not replace the file's nginx: %+v", c.Nginx)
	}
	for key, want := range map[string]string{
		"interval": "flag --interval", "weight": "env HEFT_SYNC_WEIGHT", "coordinator.url": "file " + path,
		"coordinator.token": "cleared by env HEFT_SYNC_TOKEN_FILE", "log_json": "flag --log-json", "haproxy": "flag --haproxy",
	} {
		if o, _ := rep.Origin(key); o.String() != want {
			t.Errorf("%s came from %q, want %q", key, o, want)
		}
	}

	var buf bytes.Buffer
	rep.Log(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info}))
	out := buf.String()
	for _, want := range []string{
		"file=" + path,
		`interval="1m (flag --interval)"`,
		`[WARN]  setting overridden: key=interval value=1m from="flag --interval" overrides="10s (env HEFT_SYNC_INTERVAL)"`,
		`[WARN]  setting replaced: key=coordinator.token by="env HEFT_SYNC_TOKEN_FILE" replaced="[redacted] (file ` + path + `)"`,
		`haproxy="model=a,socket=/s,backend=b,drain=2s; model=c,socket=/s,backend=d (flag --haproxy)"`,
		`nginx="model=x,file=/a; model=y,file=/b,reload=systemctl reload nginx (env HEFT_SYNC_NGINX)"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "from-file") {
		t.Errorf("a secret was logged:\n%s", out)
	}
	if strings.Contains(out, "weight=") && strings.Contains(out, "setting overridden: key=weight") {
		t.Errorf("env over a default is not an override:\n%s", out)
	}
}

func TestSameValueIsNoOverride(t *testing.T) {
	c := syncDefault()
	path := writeFile(t, "s.toml", "interval = \"30s\"\n", 0o600)
	rep, err := c.command().Load(path, []string{"--interval", "30s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rep.Log(hclog.New(&hclog.LoggerOptions{Output: &buf}))
	if strings.Contains(buf.String(), "WARN") {
		t.Errorf("a flag repeating the file's value warned:\n%s", buf.String())
	}
}

func TestBareNumberDurationRefusedEverywhere(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"top level", "weight = 2\ninterval = 30\n", []string{"line 2", `write interval = "30s"`}},
		{"float", "interval = 1.5\n", []string{`write interval = "1.5s"`}},
		{"in an array of tables", "[[haproxy]]\nmodel = \"m\"\ndrain = 10\n", []string{"haproxy 1", "line 3", `write drain = "10s"`}},
		{"not a duration", "interval = \"soon\"\n", []string{`"soon" is not a duration`}},
		{"wrong type", "interval = true\n", []string{"interval must be a duration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := syncDefault()
			err := c.command().Parse(tc.text)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want one mentioning %q", err, w)
				}
			}
		})
	}
	c := syncDefault()
	_, err := c.command().Load("", nil, envOf(map[string]string{"HEFT_SYNC_INTERVAL": "30"}))
	if err == nil || !strings.Contains(err.Error(), "HEFT_SYNC_INTERVAL") || !strings.Contains(err.Error(), "write 30s") {
		t.Errorf("env: err = %v", err)
	}
	_, err = c.command().Load("", []string{"--interval", "30"}, nil)
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "write 30s") {
		t.Errorf("flag: err = %v, want a usage error saying what to write", err)
	}
}

func TestFileProblemsAllNamed(t *testing.T) {
	c := syncDefault()
	err := c.command().Parse(`colour = "blue"
[coordinator]
url = 5
tokn = "x"
[[haproxy]]
model = "m"
adress = "x"
[extra]
a = 1
b = 2
`)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"line 3", "coordinator.url", "unknown keys: colour, coordinator.tokn, haproxy.adress, extra"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "extra.a") {
		t.Errorf("keys of an unknown table listed one by one:\n%v", err)
	}
	for _, tc := range []struct{ text, want string }{
		{"[haproxy]\nmodel = \"m\"\n", "[[haproxy]]"},
		{"coordinator = 5\n", "coordinator must be a table"},
		{"haproxy = [1, 2]\n", "haproxy 1: want a table"},
		{"[coordinator\nurl=", "At line 2"},
	} {
		c := syncDefault()
		if err := c.command().Parse(tc.text); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one mentioning %q", tc.text, err, tc.want)
		}
	}
	// Dotted keys make the same table as a [table] header does.
	c = syncDefault()
	if err := c.command().Parse("coordinator.url = \"http://x:1\"\n"); err != nil || c.Coordinator.URL != "http://x:1" {
		t.Errorf("a dotted key: %v, url %q", err, c.Coordinator.URL)
	}
	// A flag-only setting is no key of the file, and has no variable.
	c = syncDefault()
	if err := c.command().Parse("check = true\n"); err == nil || !strings.Contains(err.Error(), "unknown keys: check") {
		t.Errorf("check in the file: %v", err)
	}
	c = syncDefault()
	if _, err := c.command().Load("", nil, envOf(map[string]string{"HEFT_SYNC_CHECK": "true"})); err != nil || c.Check {
		t.Errorf("HEFT_SYNC_CHECK: %v, check %t", err, c.Check)
	}
	// A list of words keeps an empty array apart from an absent one, and
	// refuses what is not a list of strings, with its line.
	c = syncDefault()
	if err := c.command().Parse("[[nginx]]\ndirectives = []\n[[nginx]]\n"); err != nil || c.Nginx[0].Directives == nil || c.Nginx[1].Directives != nil {
		t.Errorf("empty and absent: %v %#v", err, c.Nginx)
	}
	c = syncDefault()
	if err := c.command().Parse("[[nginx]]\nmodel = \"m\"\ndirectives = \"least_conn\"\n"); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a string for a list: %v", err)
	}
	// An inline array of tables is an array of tables too.
	c = syncDefault()
	if err := c.command().Parse(`nginx = [{model = "m", file = "/f"}]`); err != nil || len(c.Nginx) != 1 || c.Nginx[0].Reload == "" {
		t.Errorf("inline: %v %+v", err, c.Nginx)
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want error
		says string
	}{
		{"help", []string{"-h"}, flag.ErrHelp, ""},
		{"long help", []string{"--help"}, flag.ErrHelp, ""},
		{"version", []string{"--version"}, ErrVersion, ""},
		{"unknown flag", []string{"--nope"}, nil, "nope"},
		{"stray argument", []string{"run"}, nil, `unexpected argument "run"`},
		{"secret without a flag", []string{"--coordinator-token", "x"}, nil, "coordinator-token"},
		{"bad list entry", []string{"--haproxy", "model"}, nil, "not key=value"},
		{"unknown list key", []string{"--haproxy", "colour=red"}, nil, "unknown key \"colour\" (want model, socket, backend, drain)"},
		{"bad bool", []string{"--log-json=maybe"}, nil, `--log-json: "maybe" is not true or false`},
		{"bad duration", []string{"--interval", "soon"}, nil, `--interval: "soon" is not a duration`},
		{"no value", []string{"--interval"}, nil, "flag needs an argument: --interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := syncDefault()
			_, err := c.command().Load("", tc.args, nil)
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want a *UsageError", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.says)
			}
		})
	}
	c := syncDefault()
	if _, err := c.command().Load("", []string{"--config", filepath.Join(t.TempDir(), "none.toml")}, nil); err == nil ||
		!strings.Contains(err.Error(), "none.toml") {
		t.Errorf("missing file: %v", err)
	}
	path := writeFile(t, "s.toml", "weight = 3\n", 0o600)
	if _, err := c.command().Load("", nil, envOf(map[string]string{"HEFT_SYNC_CONFIG": path})); err != nil || c.Weight != 3 {
		t.Errorf("HEFT_SYNC_CONFIG: %v, weight %g", err, c.Weight)
	}
}

func TestUsageAndExit(t *testing.T) {
	c := syncDefault()
	cmd := c.command()
	var help bytes.Buffer
	cmd.Usage(&help)
	for _, want := range []string{"usage: heft-sync [--config FILE]", "--config FILE", "HEFT_SYNC_CONFIG",
		"--coordinator URL", "--interval DURATION", "HEFT_SYNC_INTERVAL; default 5s", "--log-json ", "--haproxy KEY=VALUE,...",
		"--version", "-h, --help", "environment only (secrets stay off the command line): HEFT_SYNC_TOKEN"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, help.String())
		}
	}
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--help"}, 0, "usage: heft-sync", ""},
		{[]string{"--version"}, 0, "heft-sync ", ""},
		{[]string{"--bogus"}, ExitUsage, "", "heft-sync: unknown flag: --bogus\n\nusage: heft-sync"},
		{[]string{"--interval", "1"}, ExitUsage, "", "write 1s"},
		{[]string{"--config", writeFile(t, "bad.toml", "interval = 3\n", 0o600)}, ExitConfig, "",
			"heft-sync: the configuration has problems:\n  config "},
	} {
		c := syncDefault()
		cmd := c.command()
		_, err := cmd.Load("", tc.args, nil)
		var stdout, stderr bytes.Buffer
		code := Exit(cmd.Name, err, cmd.Usage, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) ||
			(tc.stdout == "") != (stdout.Len() == 0) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout.String(), stderr.String(),
				tc.code, tc.stdout, tc.stderr)
		}
	}
}

func TestDescribeRedactsSecrets(t *testing.T) {
	c := syncDefault()
	c.Coordinator.Token = "hunter2"
	d := c.command().Describe()
	if strings.Contains(d, "hunter2") || !strings.Contains(d, "coordinator.token=[redacted]") || !strings.Contains(d, "interval=5s") {
		t.Errorf("describe = %s", d)
	}
}

func TestParseFlags(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("heft-sim", flag.ContinueOnError)
		fs.String("flavor", "vllm", "engine to `imitate`")
		fs.Bool("version", false, "print the version and exit")
		return fs
	}
	for _, tc := range []struct {
		args           []string
		code           int
		ok             bool
		stdout, stderr string
	}{
		{[]string{"--flavor", "sglang"}, 0, true, "", ""},
		{[]string{"-h"}, 0, false, "--flavor IMITATE", ""},
		{[]string{"--version"}, 0, false, "heft-sim ", ""},
		{[]string{"--nope"}, 2, false, "", "heft-sim: unknown flag: --nope"},
		{[]string{"extra"}, 2, false, "", `unexpected argument "extra"`},
	} {
		fs := newFS()
		var stdout, stderr bytes.Buffer
		code, ok := ParseFlags(fs, tc.args, func(w io.Writer) { PrintFlags(w, fs) }, &stdout, &stderr)
		if code != tc.code || ok != tc.ok || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("%v: %d %t stdout %q stderr %q", tc.args, code, ok, stdout.String(), stderr.String())
		}
	}
}

func TestReadTokenFile(t *testing.T) {
	if tok, err := ReadTokenFile(writeFile(t, "a", "  tok \n", 0o600)); err != nil || tok != "tok" {
		t.Errorf("0600: %q %v", tok, err)
	}
	// root:heft 0640 is how the packages and the install script lay it out.
	if tok, err := ReadTokenFile(writeFile(t, "b", "tok\n", 0o640)); err != nil || tok != "tok" {
		t.Errorf("0640: %q %v", tok, err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"world readable", writeFile(t, "c", "tok\n", 0o644), "chmod 600"},
		{"group writable", writeFile(t, "d", "tok\n", 0o660), "mode 0660"},
		{"empty", writeFile(t, "e", " \n\n", 0o600), "is empty"},
		{"two words on a line", writeFile(t, "f", "a b\n", 0o600), "line 1 holds a space"},
		{"too large", writeFile(t, "g", strings.Repeat("x", MaxTokenFile+1), 0o600), "larger than 4096 bytes"},
		{"missing", filepath.Join(t.TempDir(), "nope"), "no such file"},
		{"directory", t.TempDir(), "not a regular file"},
	} {
		if _, err := ReadTokenFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

// During a rotation a token file holds the old and the new token, one a
// line; a client presents the last, the newest.
func TestReadTokensFile(t *testing.T) {
	path := writeFile(t, "rot", "old-token\n\n  new-token  \n", 0o600)
	toks, err := ReadTokensFile(path)
	if err != nil || len(toks) != 2 || toks[0] != "old-token" || toks[1] != "new-token" {
		t.Fatalf("ReadTokensFile: %q %v", toks, err)
	}
	if tok, err := ReadTokenFile(path); err != nil || tok != "new-token" {
		t.Errorf("ReadTokenFile: %q %v, want the last one", tok, err)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{6 * time.Hour: "6h", 90 * time.Minute: "1h30m", 30 * time.Second: "30s",
		time.Minute: "1m", 250 * time.Millisecond: "250ms", 0: "0s", time.Hour + time.Second: "1h0m1s"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
