// Package version holds the build's version, set at link time with
// -ldflags "-X heft/shared/version.Version=v1.2.3".
package version

// Version is the release of this build; "dev" for a plain go build.
var Version = "dev"
