package enginelog

// Grammar is one engine kind's log grammar: how its lines name ranks and
// what they say. Each kind's lives beside its descriptor in agent/engine
// (engine.LogGrammar finds it); this package reads a log with whichever
// grammar it is given and knows no kind by name.
type Grammar struct {
	// Kind is the engine kind, as Facts.Engine and messages write it.
	Kind string
	// Segment reads one '\r'-separated segment of a line. first is set for
	// the line's first segment; line is the rank state shared by the
	// line's segments (vLLM names the process at a line's start only). It
	// returns the segment's event, if any, and the rank its prefix names.
	Segment func(seg string, first bool, line *Proc) (Event, Proc, bool)
	// CommandLine reads a whole line for an event beside its segments'
	// (after them): a command line a launch script echoed (EventDPSize,
	// EventRouter), or the pool on the command line a server starts its
	// runner with (Ollama). nil when the kind has none.
	CommandLine func(line string) (Event, bool)
	// Formats are the kind's pool formats, best first: lines of several
	// formats for one rank give the best one's figure.
	Formats []string
	// PerStream are the formats whose figure is one stream's cells of a
	// cache that may be split into streams, one per slot, without saying
	// how many (llama.cpp's "creating non-SWA KV cache, size = N cells").
	// Such a figure counts as N × S once a pool line of the same start-up
	// and rank names S streams for exactly N cells (Event.Cells,
	// Event.Streams); until then it counts for nothing, and neither do the
	// lines that named streams, as they are the caches' own and the
	// smallest of them is not the pool.
	PerStream []string
	// Resized are the formats an engine may print again for the same TP
	// rank within one start-up, having sized the pool again (clamped it to
	// a configured maximum): a later line replaces that TP rank's earlier
	// one, where other formats' lines are TP ranks that disagree.
	Resized []string
	// PoolLines says what the kind's pool lines look like, for the error
	// when a log holds none.
	PoolLines string
	// BlockFormat is the format whose pools are counted in blocks
	// (Event.Blocks), "" for none; BlockSizeKey is the launch argument
	// giving the block size, DefaultBlockSize the size without it.
	BlockFormat      string
	BlockSizeKey     string
	DefaultBlockSize int64
	// DPKey is the launch argument that gives the data-parallel size.
	DPKey string
	// ArgsOmitDefaultDP: the launch args, read whole, leave DPKey out when
	// the data-parallel size is the default 1 (vLLM's "non-default args",
	// or a Namespace from before data parallelism), so a start-up whose
	// args were read and lack it has one rank, whatever its prefixes say
	// (v0.8.3 to v0.10.1 name a single engine "EngineCore_0").
	ArgsOmitDefaultDP bool
	// ServerPort, when set, is the launch argument naming the server's
	// port: launch args with another port in one start-up are another
	// server in the same log, not a restart.
	ServerPort string
	// SharedPools tells, from the launch args, whether the engine sizes
	// every DP rank's pool together, so a rank that printed none holds
	// what the others printed; SharedPoolsWhy says why, for the note.
	// nil: never.
	SharedPools    func(args map[string]string) bool
	SharedPoolsWhy string
	// MultiNodeKeys are the launch arguments that describe a multi-node
	// launch (a value other than None, False or, for nnodes, 1).
	MultiNodeKeys []string
	// Mistaken is the kind whose logs are most often read with this
	// kind's name, for the "try engine ..." hint; nil for none.
	Mistaken *Grammar
}
