package server

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"heft/coordinator/audit"
)

// Backuper writes a consistent copy of the coordinator's state file
// (store.Bolt.Backup).
type Backuper interface {
	Backup(w io.Writer, size func(int64)) (int64, error)
}

// backupWriteTimeout bounds one backup download: longer than an API
// answer's, for a large state file over a slow link.
const backupWriteTimeout = 10 * time.Minute

// backup is GET /api/v1/backup (admin): the state file, copied from one
// read transaction while the coordinator goes on writing. Its length is
// announced, so a cut download fails at the client instead of leaving a
// short copy (heft-coordinator backup checks the copy too).
func (s *Server) backup(w http.ResponseWriter, r *http.Request) {
	if s.opts.State == nil {
		writeError(w, http.StatusNotImplemented, "this coordinator keeps no state file to back up")
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(backupWriteTimeout))
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	started := false
	n, err := s.opts.State.Backup(w, func(size int64) {
		started = true
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Disposition", `attachment; filename="heft.db"`)
		h.Set("Cache-Control", "no-store")
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
	})
	if err != nil {
		s.log.Error("backup failed", "bytes_written", n, "error", err)
		if !started {
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		// Once started, the short body against Content-Length tells the
		// client; net/http closes the connection.
		return
	}
	s.record(r, audit.Entry{Action: "backup", Target: "state", New: strconv.FormatInt(n, 10) + " bytes"})
}
