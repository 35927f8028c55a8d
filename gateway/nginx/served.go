package nginx

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"heft/gateway/target"
)

// Served implements syncer.Reader: the servers of the upstream block in
// the file that are neither down nor backup, with their weights (nginx's
// default 1). It is the operator's starting file before heft-sync's first
// write, and heft-sync's own after, and heft-sync owns every line of it.
func (n *Nginx) Served(ctx context.Context) ([]target.Served, error) {
	data, err := os.ReadFile(n.cfg.File)
	if err != nil {
		return nil, err
	}
	return upstreamServers(string(data), n.cfg.Upstream)
}

// upstreamServers reads the servers of upstream name in an nginx file.
func upstreamServers(text, name string) ([]target.Served, error) {
	stmts, err := parseBlock(tokens(text))
	if err != nil {
		return nil, err
	}
	for _, st := range stmts {
		if len(st.args) == 2 && st.args[0] == "upstream" && st.args[1] == name && st.block != nil {
			var out []target.Served
			for _, s := range st.block {
				if srv, ok := servedLine(s.args); ok {
					out = append(out, srv)
				}
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("no upstream %q in the file", name)
}

// servedLine reads "server ADDRESS [weight=N] [down] [backup] ...".
func servedLine(args []string) (target.Served, bool) {
	if len(args) < 2 || args[0] != "server" || strings.HasPrefix(args[1], "unix:") {
		return target.Served{}, false
	}
	s := target.Served{Address: args[1], Weight: 1, Owned: true}
	if _, _, err := net.SplitHostPort(s.Address); err != nil {
		s.Address = net.JoinHostPort(strings.Trim(s.Address, "[]"), "80")
	}
	for _, p := range args[2:] {
		switch {
		case p == "down" || p == "backup":
			return target.Served{}, false
		case strings.HasPrefix(p, "weight="):
			w, err := strconv.Atoi(strings.TrimPrefix(p, "weight="))
			if err != nil || w < 1 {
				return target.Served{}, false
			}
			s.Weight = float64(w)
		}
	}
	return s, true
}

// statement is one nginx directive: its words, and its block if it has one.
type statement struct {
	args  []string
	block []statement // nil: ends with ";"
}

// tokens splits nginx configuration text into words, quoted strings
// (unquoted), and the punctuation ";", "{", "}", dropping comments.
func tokens(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == ';' || c == '{' || c == '}':
			out = append(out, string(c))
			i++
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(text) && text[j] != c {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			out = append(out, text[i+1:min(j, len(text))])
			i = j + 1
		default:
			j := i
			for j < len(text) && !strings.ContainsRune(" \t\r\n;{}#", rune(text[j])) {
				j++
			}
			out = append(out, text[i:j])
			i = j
		}
	}
	return out
}

// parseBlock reads statements until the tokens end.
func parseBlock(toks []string) ([]statement, error) {
	stmts, rest, err := parseUntilClose(toks, 0)
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("unexpected %q", rest[0])
	}
	return stmts, nil
}

func parseUntilClose(toks []string, depth int) ([]statement, []string, error) {
	var stmts []statement
	var args []string
	for len(toks) > 0 {
		t := toks[0]
		toks = toks[1:]
		switch t {
		case ";":
			stmts = append(stmts, statement{args: args})
			args = nil
		case "{":
			if depth >= 16 {
				return nil, nil, fmt.Errorf("blocks nested too deep")
			}
			block, rest, err := parseUntilClose(toks, depth+1)
			if err != nil {
				return nil, nil, err
			}
			if block == nil {
				block = []statement{}
			}
			stmts = append(stmts, statement{args: args, block: block})
			args, toks = nil, rest
		case "}":
			if depth == 0 {
				return nil, nil, fmt.Errorf("unexpected \"}\"")
			}
			if len(args) > 0 {
				return nil, nil, fmt.Errorf("%q has no \";\"", strings.Join(args, " "))
			}
			return stmts, toks, nil
		default:
			args = append(args, t)
		}
	}
	if depth > 0 {
		return nil, nil, fmt.Errorf("a block has no \"}\"")
	}
	if len(args) > 0 {
		return nil, nil, fmt.Errorf("%q has no \";\"", strings.Join(args, " "))
	}
	return stmts, nil, nil
}
