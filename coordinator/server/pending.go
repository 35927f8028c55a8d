package server

import (
	"net/http"

	"heft/coordinator/nodes"
	"heft/shared/view"
)

// listPendingNodes is GET /api/v1/pending-nodes: the names of the nodes
// waiting for an admin's approval, and nothing else about them, guarded
// as the workers list is. heft-sync reads it with the token it follows
// the fleet with: a coordinator restarted on an empty state holds every
// node for approval, and heft-sync keeps routing their workers meanwhile
// instead of draining them. The node records themselves (credentials,
// addresses) stay behind the node reads' guard.
func (s *Server) listPendingNodes(w http.ResponseWriter, r *http.Request) {
	out := view.PendingNodes{Nodes: []string{}}
	for _, rec := range s.opts.Nodes.List() {
		if rec.State == nodes.StatePending {
			out.Nodes = append(out.Nodes, rec.Name)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
