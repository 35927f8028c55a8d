package engine

import "heft/agent/enginelog"

// LogFacts are what an engine's start-up log said (see agent/enginelog).
type LogFacts = enginelog.Facts
