package coordinator

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"heft/coordinator/fleet"
	"heft/shared/testutil"
	"heft/shared/view"
	"heft/shared/wire"
)

// The fleet docs/api.md's "Admin API" and docs/monitoring.md's "Metrics"
// sections show: node
// gpu-a serves Qwen/Qwen3-8B twice, gpu-b once with two data-parallel
// ranks whose KV pools differ by 15 % (a warning, not a hold); all three
// are measured and admitted.
var readmeEngines = []struct {
	node, id, url string
	tps           float64
	ranks         []wire.Rank
}{
	{"gpu-a", "7c1e5a90d24b36f8", "http://10.0.0.5:8000", 2000, nil},
	{"gpu-a", "e03b9f6a1c7d5248", "http://10.0.0.5:8001", 1000, nil},
	{"gpu-b", "4d8a2f6c0b9e1735", "http://10.0.0.6:30000", 1500, []wire.Rank{{DPRank: 0, KVTokens: 24094}, {DPRank: 1, KVTokens: 20480}}},
}

// readmeFleet runs a coordinator on loopback, on a fixed clock, with the
// README's fleet connected over real websockets.
func readmeFleet(t *testing.T) *running {
	t.Helper()
	clk := newClock()
	r := start(t, testConfig(t), WithClock(clk.now))
	agents := map[string]*agent{}
	engines := map[string][]wire.Engine{}
	for _, e := range readmeEngines {
		if agents[e.node] == nil {
			agents[e.node] = connectAgent(t, r, e.node)
		}
		eng := wire.Engine{Kind: wire.EngineVLLM, URL: e.url, Model: testModel, Ready: true, CapacityKey: e.id, Ranks: e.ranks}
		if e.ranks != nil {
			eng.Kind = wire.EngineSGLang
		}
		engines[e.node] = append(engines[e.node], eng)
	}
	for node, a := range agents {
		s := snapshot(node, clk.now(), engines[node]...)
		a.send(&s)
		for range engines[node] {
			req := a.read()
			if req.Type != wire.TypeProbeRequest {
				t.Fatalf("%s got %s, want a probe request", node, req.Type)
			}
			for _, e := range readmeEngines {
				if e.id == req.ProbeRequest.CapacityKey {
					m := measured(e.id, node, e.tps, clk.now())
					m.EngineURL = e.url
					a.send(&wire.ProbeResult{RequestID: req.ProbeRequest.RequestID, Measurement: m})
				}
			}
		}
	}
	testutil.Eventually(t, "the README's fleet admitted", 10*time.Second, func() bool {
		ws, _ := r.Fleet().Find(fleet.Query{State: view.StateAdmitted})
		return len(ws) == len(readmeEngines)
	})
	return r
}

// readmeExample is one curl command of the README and the answer shown
// under it.
type readmeExample struct {
	command string
	lang    string // "http": status, headers, JSON body; "text": lines the output holds
	answer  string
}

var fenceRE = regexp.MustCompile("(?ms)^```(\\w*)\\n(.*?)^```")

// readmeExamples returns the curl examples of the section headed title (a
// "# ", "## " or "### " line) of the guide page file (a path from the
// repository's root), each with the answer block after it. A "# " title is
// the page's own: its section is the whole page.
func readmeExamples(t *testing.T, file, title string) []readmeExample {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	text := "\n" + string(data) // so that a title on the first line is found too
	level := strings.Fields(title)[0] + " "
	start := strings.Index(text, "\n"+title+"\n")
	if start < 0 {
		t.Fatalf("%s has no section %q", file, title)
	}
	section := text[start+len(title)+2:]
	if end := strings.Index(section, "\n"+level); end >= 0 && level != "# " {
		section = section[:end]
	}
	if level == "### " {
		if end := strings.Index(section, "\n## "); end >= 0 {
			section = section[:end]
		}
	}
	blocks := fenceRE.FindAllStringSubmatch(section, -1)
	var out []readmeExample
	for i, b := range blocks {
		if b[1] != "sh" || !strings.HasPrefix(b[2], "curl ") {
			continue
		}
		if i+1 == len(blocks) || (blocks[i+1][1] != "http" && blocks[i+1][1] != "text") {
			t.Fatalf("README %s: no answer block (```http or ```text) after\n%s", title, b[2])
		}
		out = append(out, readmeExample{command: strings.TrimSpace(b[2]), lang: blocks[i+1][1], answer: blocks[i+1][2]})
	}
	return out
}

// runCurl runs a README command with the real curl and the shell, with
// $HEFT and $ADMIN set as the README says.
func runCurl(t *testing.T, r *running, command string) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", command)
	cmd.Env = append(os.Environ(), "HEFT="+r.base, "ADMIN="+adminToken)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	return string(out)
}

// checkHTTP compares curl -i's output with a shown answer: the status
// code, each header shown, and the JSON body, whose every field shown must
// be there with that value (the README shortens answers, never adds).
func checkHTTP(got, shown string) error {
	got = strings.ReplaceAll(got, "\r\n", "\n")
	gotHead, gotBody, _ := strings.Cut(got, "\n\n")
	shownHead, shownBody, _ := strings.Cut(shown, "\n\n")
	gotLines, shownLines := strings.Split(gotHead, "\n"), strings.Split(strings.TrimSpace(shownHead), "\n")
	gotStatus, shownStatus := strings.Fields(gotLines[0]), strings.Fields(shownLines[0])
	if len(gotStatus) < 2 || len(shownStatus) < 2 || gotStatus[1] != shownStatus[1] {
		return fmt.Errorf("status %q, README shows %q", gotLines[0], shownLines[0])
	}
	for _, h := range shownLines[1:] {
		if !slices.ContainsFunc(gotLines[1:], func(g string) bool { return strings.EqualFold(g, h) }) {
			return fmt.Errorf("no header %q in\n%s", h, gotHead)
		}
	}
	var want, have any
	if err := json.Unmarshal([]byte(shownBody), &want); err != nil {
		return fmt.Errorf("the README's body is not JSON: %v\n%s", err, shownBody)
	}
	if err := json.Unmarshal([]byte(gotBody), &have); err != nil {
		return fmt.Errorf("the answer is not JSON: %v\n%s", err, gotBody)
	}
	return subset("body", want, have)
}

// subset reports where have lacks something of want: objects may hold
// more keys than shown; arrays have as many elements as shown.
func subset(path string, want, have any) error {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v, README shows an object", path, have)
		}
		for k, v := range w {
			hv, ok := h[k]
			if !ok {
				return fmt.Errorf("%s.%s is missing", path, k)
			}
			if err := subset(path+"."+k, v, hv); err != nil {
				return err
			}
		}
		return nil
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return fmt.Errorf("%s: %v, README shows %d elements", path, have, len(w))
		}
		for i := range w {
			if err := subset(path+"["+strconv.Itoa(i)+"]", w[i], h[i]); err != nil {
				return err
			}
		}
		return nil
	default:
		if fmt.Sprint(want) != fmt.Sprint(have) {
			return fmt.Errorf("%s = %v, README shows %v", path, have, want)
		}
		return nil
	}
}

// TestREADMEAdminAPI runs every curl of docs/api.md's "Admin API" page,
// in order, against the README's fleet, and checks the answers it shows.
// The section must show every action and every error an operator meets.
func TestREADMEAdminAPI(t *testing.T) {
	needTool(t, "curl")
	examples := readmeExamples(t, "docs/api.md", "# Admin API")
	r := readmeFleet(t)
	statuses, routes := map[string]bool{}, map[string]bool{}
	for _, ex := range examples {
		got := runCurl(t, r, ex.command)
		var err error
		if ex.lang == "http" {
			err = checkHTTP(got, ex.answer)
			statuses[strings.Fields(ex.answer)[1]] = true
		} else {
			err = checkLines(got, ex.answer)
		}
		if err != nil {
			t.Errorf("README example\n  %s\n%v", ex.command, err)
		}
		method := "GET"
		if m := regexp.MustCompile(`-X (\w+)`).FindStringSubmatch(ex.command); m != nil {
			method = m[1]
		}
		if m := regexp.MustCompile(`/(pin|probe|admit|hold)\b`).FindStringSubmatch(ex.command); m != nil {
			routes[method+" "+m[1]] = true
		}
	}
	for _, want := range []string{"POST pin", "DELETE pin", "POST probe", "POST admit", "POST hold"} {
		if !routes[want] {
			t.Errorf("the Admin API section shows no %s", want)
		}
	}
	for _, want := range []string{"200", "400", "401", "404", "405", "409"} {
		if !statuses[want] {
			t.Errorf("the Admin API section shows no %s answer", want)
		}
	}
}

// TestREADMEMetrics runs the curl of docs/monitoring.md's "Metrics" section against
// the README's fleet: every /metrics line it shows is exported as shown.
func TestREADMEMetrics(t *testing.T) {
	needTool(t, "curl")
	examples := readmeExamples(t, "docs/monitoring.md", "## Metrics")
	if len(examples) == 0 {
		t.Fatal("the Metrics section shows no scrape")
	}
	r := readmeFleet(t)
	for _, ex := range examples {
		if err := checkLines(runCurl(t, r, ex.command), ex.answer); err != nil {
			t.Errorf("README example\n  %s\n%v", ex.command, err)
		}
	}
}

// checkLines reports the shown lines the output lacks.
func checkLines(got, shown string) error {
	lines := strings.Split(got, "\n")
	var missing []string
	for _, l := range strings.Split(strings.TrimSpace(shown), "\n") {
		if !slices.Contains(lines, l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the output lacks\n%s\nit is\n%s", strings.Join(missing, "\n"), got)
	}
	return nil
}
