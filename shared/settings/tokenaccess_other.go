//go:build !unix

package settings

// accessHint has nothing to add where files have no Unix owner.
func accessHint(string, error) string { return "" }
