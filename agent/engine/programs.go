package engine

// LooksLikeEngine reports whether a command line launches one of the
// engines heft knows (heft-sim included), for engine discovery.
func LooksLikeEngine(argv []string) bool { return looksLikeEngine(argv) }

// LaunchesEngine is LooksLikeEngine for a command line that also carries
// launch arguments: the process discovery takes as an engine's root.
func LaunchesEngine(argv []string) bool { return launchesEngine(argv) }
