package packaging

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"heft/packaging/elfcheck"
	"heft/shared/testutil"
)

var rpmArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}

// packageVersion is what scripts/version.sh makes of VERSION for the
// packages (version as given, or the file's when "").
func packageVersion(t *testing.T, version string) string {
	t.Helper()
	var env []string
	if version != "" {
		env = []string{"VERSION=" + version}
	}
	return strings.TrimSpace(run(t, testutil.RepoRoot(t), env, "sh", "scripts/version.sh", "--package"))
}

// builtPackages holds the folders buildPackages filled, by version, so
// that tests share a build; TestMain removes them.
var builtPackages = map[string]string{}

// buildPackages runs scripts/package.sh once per version into a folder of
// its own; version "" uses the VERSION file.
func buildPackages(t *testing.T, version string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds packages")
	}
	if runtime.GOOS != "linux" {
		t.Skip("linux packages")
	}
	if dist, ok := builtPackages[version]; ok {
		return dist
	}
	dist, err := os.MkdirTemp("", "heft-packages-")
	if err != nil {
		t.Fatal(err)
	}
	builtPackages[version] = dist
	env := []string{"DIST=" + dist}
	if version != "" {
		env = append(env, "VERSION="+version)
	}
	run(t, testutil.RepoRoot(t), env, "bash", "scripts/package.sh")
	return dist
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dist := range builtPackages {
		os.RemoveAll(dist)
	}
	os.Exit(code)
}

func TestPackages(t *testing.T) {
	dist := buildPackages(t, "")
	dpkg := need(t, "dpkg-deb")
	root := testutil.RepoRoot(t)
	versionFile, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(versionFile))
	pkgVersion := packageVersion(t, "") + "-1"
	arch := runtime.GOARCH
	var debs []string
	for _, pkg := range []string{"agent", "coordinator", "sync"} {
		deb := filepath.Join(dist, "heft-"+pkg+"_"+pkgVersion+"_"+arch+".deb")
		debs = append(debs, deb)
		t.Run(pkg, func(t *testing.T) {
			if _, err := os.Stat(deb); err != nil {
				entries, _ := os.ReadDir(dist)
				t.Fatalf("no %s in %v", filepath.Base(deb), entries)
			}
			scratch := t.TempDir()
			run(t, "", nil, dpkg, "-x", deb, scratch)
			doc := "usr/share/doc/heft-" + pkg + "/"
			for _, f := range []string{"usr/bin/heft-" + pkg, "usr/lib/systemd/system/heft-" + pkg + ".service", "etc/heft/" + pkg + ".toml",
				doc + "copyright", doc + "changelog.Debian.gz", "usr/share/lintian/overrides/heft-" + pkg} {
				if _, err := os.Stat(filepath.Join(scratch, f)); err != nil {
					t.Errorf("package lacks /%s", f)
				}
			}
			bin := filepath.Join(scratch, "usr/bin/heft-"+pkg)
			st, err := os.Stat(bin)
			if err == nil && st.Mode().Perm() != 0o755 {
				t.Errorf("binary mode %v", st.Mode().Perm())
			}

			// Version, description and dependencies in the control file.
			field := func(name string) string {
				return strings.TrimSpace(run(t, "", nil, dpkg, "-f", deb, name))
			}
			if v := field("Version"); v != pkgVersion {
				t.Errorf("Version = %q, want %q", v, pkgVersion)
			}
			if d := field("Description"); strings.Count(d, "\n") < 3 || !strings.Contains(d, "Built from heft commit ") {
				t.Errorf("Description has no long description or no commit:\n%s", d)
			}
			// The copyright file is machine-readable, and the changelog's
			// top entry is this version.
			copyright, _ := os.ReadFile(filepath.Join(scratch, doc, "copyright"))
			if !bytes.HasPrefix(copyright, []byte("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")) {
				t.Errorf("copyright is not in the machine-readable format:\n%s", copyright)
			}
			if top := firstLine(t, gunzip(t, filepath.Join(scratch, doc, "changelog.Debian.gz"))); top != "heft-"+pkg+" ("+pkgVersion+") stable; urgency=low" {
				t.Errorf("changelog starts %q: add an entry for %s to packaging/changelog.yml", top, pkgVersion)
			}

			// The version the binary reports is the package's, with the commit.
			out := run(t, "", nil, bin, "--version")
			if !regexp.MustCompile(`^heft-` + pkg + ` ` + regexp.QuoteMeta(version) + `\+[0-9a-f]{12}(-dirty)?\n$`).MatchString(out) {
				t.Errorf("binary reports %q, want heft-%s %s+<commit>", out, pkg, version)
			}

			// What the binary needs from the system, and what the package declares.
			needs, err := elfcheck.Read(bin)
			if err != nil {
				t.Fatal(err)
			}
			depends := field("Depends")
			switch pkg {
			case "coordinator", "sync":
				if !needs.Static {
					t.Errorf("heft-%s is not static: loader %q, libraries %v", pkg, needs.Interp, needs.Libraries)
				}
				if ldd, err := exec.LookPath("ldd"); err == nil {
					out, _ := exec.Command(ldd, bin).CombinedOutput()
					if !strings.Contains(string(out), "not a dynamic executable") {
						t.Errorf("ldd %s: %s", bin, out)
					}
				}
				if depends != "" {
					t.Errorf("a static binary's package depends on %q", depends)
				}
			case "agent":
				if needs.Static || needs.GlibcFloor != "" {
					t.Errorf("heft-agent: static %v, glibc floor %q: want a dynamic binary (it dlopens NVML) naming no glibc version", needs.Static, needs.GlibcFloor)
				}
				want := "libc6 (>= " + needs.DeclaredGlibc() + ")"
				if depends != want {
					t.Errorf("Depends = %q, want %q", depends, want)
				}
				// RHEL 8 has glibc 2.28; Ubuntu 20.04 and Debian 11 2.31.
				if elfcheck.CompareGlibc(needs.DeclaredGlibc(), "2.28") > 0 {
					t.Errorf("the agent needs glibc %s, which shuts out RHEL 8", needs.DeclaredGlibc())
				}
			}
			control := t.TempDir()
			run(t, "", nil, dpkg, "-e", deb, control)
			conffiles, err := os.ReadFile(filepath.Join(control, "conffiles"))
			if err != nil || !strings.Contains(string(conffiles), "/etc/heft/"+pkg+".toml") {
				t.Errorf("/etc/heft/%s.toml is not a conffile: %q %v", pkg, conffiles, err)
			}
			for _, script := range []string{"preinst", "postinst", "prerm"} {
				if _, err := os.Stat(filepath.Join(control, script)); err != nil {
					t.Errorf("no %s script", script)
				}
			}
			postinst, _ := os.ReadFile(filepath.Join(control, "postinst"))
			for _, line := range strings.Split(string(postinst), "\n") {
				line = strings.TrimSpace(line)
				if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "echo") {
					continue // telling the admin how to start it is fine
				}
				if strings.Contains(line, "enable --now") || strings.Contains(line, "systemctl start") || strings.Contains(line, "systemctl restart") {
					t.Errorf("postinst starts the service before it is configured: %s", line)
				}
			}
			if pkg == "agent" {
				agentReadsNVML(t, bin)
			}
			if pkg == "coordinator" {
				// The monitoring a fleet's Prometheus and Grafana load.
				for _, f := range []string{"prometheus/heft-rules.yml", "prometheus/scrape.yml", "prometheus/scrape-kubernetes.yml", "grafana/heft.json"} {
					if _, err := os.Stat(filepath.Join(scratch, "usr/share/heft", f)); err != nil {
						t.Errorf("package lacks /usr/share/heft/%s", f)
					}
				}
			}
			if pkg == "sync" {
				// The nginx check unit and the polkit rule that lets heft-sync
				// start it and reload nginx.
				for _, f := range []string{"usr/lib/systemd/system/heft-nginx-check.service", "usr/share/polkit-1/rules.d/50-heft-sync.rules"} {
					if _, err := os.Stat(filepath.Join(scratch, f)); err != nil {
						t.Errorf("package lacks /%s", f)
					}
				}
			}
		})
	}

	t.Run("lintian", func(t *testing.T) {
		lintian := need(t, "lintian")
		// Overrides ship in the packages (packaging/lintian), each with its reason.
		cmd := exec.Command(lintian, append([]string{"--fail-on", "error,warning", "--display-info"}, debs...)...)
		out, err := cmd.CombinedOutput()
		t.Logf("lintian:\n%s", out)
		if err != nil {
			t.Errorf("lintian: %v", err)
		}
	})

	t.Run("rpm", func(t *testing.T) {
		rpm := need(t, "rpm")
		for _, pkg := range []string{"agent", "coordinator", "sync"} {
			path := filepath.Join(dist, "heft-"+pkg+"-"+pkgVersion+"."+rpmArch[arch]+".rpm")
			if v := run(t, "", nil, rpm, "-qp", "--qf", "%{VERSION}-%{RELEASE}", path); v != pkgVersion {
				t.Errorf("%s: version %q, want %q", pkg, v, pkgVersion)
			}
			if cfg := run(t, "", nil, rpm, "-qcp", path); !strings.Contains(cfg, "/etc/heft/"+pkg+".toml") {
				t.Errorf("rpm config files: %q", cfg)
			}
			files := run(t, "", nil, rpm, "-qlp", path)
			for _, f := range []string{"/usr/bin/heft-" + pkg, "/usr/share/licenses/heft-" + pkg + "/COPYRIGHT"} {
				if !strings.Contains(files, f) {
					t.Errorf("rpm lacks %s: %q", f, files)
				}
			}
			if log := run(t, "", nil, rpm, "-qp", "--changelog", path); !strings.Contains(log, "> - "+pkgVersion+"\n") {
				t.Errorf("rpm %%changelog has no %s entry:\n%s", pkgVersion, log)
			}
			requires := run(t, "", nil, rpm, "-qp", "--requires", path)
			if hasGlibc := strings.Contains(requires, "glibc >= "+elfcheck.MinGlibc); hasGlibc != (pkg == "agent") {
				t.Errorf("%s requires:\n%s", pkg, requires)
			}
			if desc := run(t, "", nil, rpm, "-qp", "--qf", "%{DESCRIPTION}", path); !strings.Contains(desc, "Built from heft commit ") {
				t.Errorf("rpm description: %q", desc)
			}
		}
	})

	t.Run("rpmlint", func(t *testing.T) {
		rpmlint := need(t, "rpmlint")
		rpmlintSeesBinaries(t, rpmlint)
		rpms, _ := filepath.Glob(filepath.Join(dist, "*.rpm"))
		cmd := exec.Command(rpmlint, append([]string{"-c", filepath.Join(root, "packaging/rpmlint/heft.toml")}, rpms...)...)
		cmd.Env = append(os.Environ(), "PATH="+safeCpio(t)+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		t.Logf("rpmlint:\n%s", out)
		if err != nil || !strings.Contains(string(out), " 0 errors, 0 warnings") {
			t.Errorf("rpmlint: %v", err)
		}
	})
}

// agentReadsNVML runs the packaged agent against the stand-in NVML of
// agent/gpu's tests, found through LD_LIBRARY_PATH the way the dynamic
// linker finds the driver's: the CGO_ENABLED=0 binary loads it and reads
// every GPU.
func agentReadsNVML(t *testing.T, agent string) {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("gcc is missing")
		}
		t.Log("gcc not installed: the packaged agent is not run against a stand-in NVML")
		return
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("go-nvml's folder: %v", err)
	}
	lib := t.TempDir()
	build := exec.Command(cc, "-shared", "-fPIC", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1",
		"-I", filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml"),
		"-o", filepath.Join(lib, "libnvidia-ml.so.1"), testutil.Testdata(t, "nvml", "fakenvml.c"))
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	cmd := exec.Command(agent, "inspect", "--json", "--timeout", "1s", "--engine", "vllm=http://127.0.0.1:1")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib)
	js, _ := cmd.Output() // the engine is down on purpose; the GPUs are what counts
	for _, want := range []string{`"GPU-11111111-2222-3333-4444-000000000000"`, `"NVIDIA H200"`, `"sw_power_cap"`} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("the packaged agent did not read the stand-in NVML (%s missing):\n%s", want, js)
		}
	}
}

// safeCpio returns a folder holding a cpio that never writes outside the
// current folder. nfpm's rpms name files by absolute path (/usr/bin/...),
// and rpmlint unpacks with `rpm2cpio | cpio -id`: run as root, a plain cpio
// would write the package's files into the real /usr and /etc.
func safeCpio(t *testing.T) string {
	t.Helper()
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Fatal("rpmlint needs cpio")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nexec " + cpio + " --no-absolute-filenames \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "cpio"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rpmlintSeesBinaries fails when rpmlint's Python lacks the magic module:
// without it rpmlint cannot tell an ELF file from text and skips every
// binary check, reporting "no-binary" instead.
func rpmlintSeesBinaries(t *testing.T, rpmlint string) {
	t.Helper()
	script, err := os.ReadFile(rpmlint)
	if err != nil {
		t.Fatal(err)
	}
	interp, _, _ := strings.Cut(strings.TrimPrefix(string(script), "#!"), "\n")
	if out, err := exec.Command(strings.TrimSpace(interp), "-c", "import magic").CombinedOutput(); err != nil {
		t.Fatalf("rpmlint cannot classify files (install python3-magic): %v\n%s", err, out)
	}
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func firstLine(t *testing.T, s string) string {
	t.Helper()
	line, _, _ := strings.Cut(strings.TrimLeft(s, "\n"), "\n")
	return line
}

// TestPackageVersionsOrder: dpkg and rpm order the versions scripts/
// version.sh makes, including pre-releases, and rpm upgrades a package built
// from an older VERSION to this one, keeping an edited config.
func TestPackageVersionsOrder(t *testing.T) {
	dpkg := need(t, "dpkg")
	rpm := need(t, "rpm")
	order := [][2]string{{"0.1.0", "0.2.0"}, {"0.2.0", "0.10.0"}, {"0.9.9", "1.0.0"},
		{"0.3.0-rc.1", "0.3.0"}, {"0.3.0-rc.1", "0.3.0-rc.2"}, {"0.2.0", "0.3.0-rc.1"}}
	for _, pair := range order {
		older, newer := packageVersion(t, pair[0])+"-1", packageVersion(t, pair[1])+"-1"
		if err := exec.Command(dpkg, "--compare-versions", older, "lt", newer).Run(); err != nil {
			t.Errorf("dpkg does not order %s before %s", older, newer)
		}
		if got := run(t, "", nil, rpm, "--eval", `%{lua: print(rpm.vercmp("`+older+`", "`+newer+`"))}`); strings.TrimSpace(got) != "-1" {
			t.Errorf("rpm orders %s against %s as %q, want -1", older, newer, got)
		}
	}
	for _, bad := range []string{"v1.0.0", "1.0", "1.0.0+meta", "1.0.0-rc 1", "1.0.0-"} {
		cmd := exec.Command("sh", "scripts/version.sh", "--package")
		cmd.Dir = testutil.RepoRoot(t)
		cmd.Env = append(os.Environ(), "VERSION="+bad)
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("version.sh accepted %q: %s", bad, out)
		}
	}

	if os.Geteuid() != 0 {
		t.Skip("installing into an rpm root needs root")
	}
	arch := rpmArch[runtime.GOARCH]
	oldDist, newDist := buildPackages(t, "0.1.0"), buildPackages(t, "")
	oldRPM := filepath.Join(oldDist, "heft-agent-0.1.0-1."+arch+".rpm")
	newRPM := filepath.Join(newDist, "heft-agent-"+packageVersion(t, "")+"-1."+arch+".rpm")
	dpkgVersion := func(dist string) string {
		debs, _ := filepath.Glob(filepath.Join(dist, "heft-agent_*.deb"))
		if len(debs) != 1 {
			t.Fatalf("debs in %s: %v", dist, debs)
		}
		return strings.TrimSpace(run(t, "", nil, "dpkg-deb", "-f", debs[0], "Version"))
	}
	if o, n := dpkgVersion(oldDist), dpkgVersion(newDist); exec.Command(dpkg, "--compare-versions", n, "gt", o).Run() != nil {
		t.Errorf("dpkg does not see the built %s as newer than %s", n, o)
	}

	// rpm into a scratch root, without scripts (they would add users).
	root := t.TempDir()
	rpmIn := func(args ...string) (string, error) {
		if args[0] != "-q" {
			args = append([]string{"--noscripts", "--nodeps", "--nosignature"}, args...)
		}
		out, err := exec.Command(rpm, append([]string{"--root", root}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := rpmIn("-i", oldRPM); err != nil {
		t.Fatalf("install 0.1.0: %v\n%s", err, out)
	}
	conf := filepath.Join(root, "etc/heft/agent.toml")
	edited := "# edited by the admin\n"
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(edited)
	f.Close()
	if out, err := rpmIn("-U", newRPM); err != nil {
		t.Fatalf("upgrade: %v\n%s", err, out)
	}
	if q, _ := rpmIn("-q", "heft-agent"); !strings.HasPrefix(q, "heft-agent-"+packageVersion(t, "")+"-1") {
		t.Errorf("installed after the upgrade: %q", q)
	}
	if b, _ := os.ReadFile(conf); !strings.HasSuffix(string(b), edited) {
		t.Errorf("the upgrade lost the admin's edit of agent.toml:\n%s", b)
	}
	if out, err := rpmIn("-U", oldRPM); err == nil || !strings.Contains(out, "which is newer than") {
		t.Errorf("rpm let 0.1.0 replace the newer package: %v\n%s", err, out)
	}
}
