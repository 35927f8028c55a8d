package enginelog_test

import (
	"testing"

	"heft/agent/engine"
	"heft/agent/enginelog"
)

// gram is the log grammar of kind, which lives with the kind's engine
// descriptor.
func gram(tb testing.TB, kind string) *enginelog.Grammar {
	tb.Helper()
	g, err := engine.LogGrammar(kind)
	if err != nil {
		tb.Fatal(err)
	}
	return g
}
