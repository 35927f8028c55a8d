// Package web serves the coordinator's dashboard: static files embedded in
// the binary, no build step. The page reads /api/v1/workers and the
// /api/v1/events stream. The files themselves are public; when a viewer
// token is configured the page sends it with each API call (Bearer
// header, or ?token= for EventSource, which cannot set headers).
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// Handler serves the dashboard's files, index.html at "/".
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return http.FileServerFS(sub)
}
