package coord

import "context"

// Workers reads GET /api/v1/workers once, with the follower's token and
// client, as the first step of every session does: heft-sync --check uses
// it to prove the coordinator answers and the token is accepted.
func (f *Follower) Workers(ctx context.Context) ([]Worker, error) {
	return f.readWorkers(ctx)
}
