package nginx

import (
	"context"

	"heft/gateway/filewrite"
)

// RunCheck runs the configured check command (default nginx -t) once, as
// Apply runs it after writing the upstream file, so heft-sync --check
// fails where the first apply would (a pid file the service user cannot
// open, a config that does not parse).
func (n *Nginx) RunCheck(ctx context.Context) error {
	return filewrite.Run(ctx, n.cfg.Check, n.cfg.Timeout)
}
