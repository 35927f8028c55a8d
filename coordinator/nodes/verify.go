package nodes

// Verify reports whether cred is the credential of the node name, which
// an admin has not rejected: such a connection may speak for the node
// without the shared agent token (Admit still decides on its hello).
func (r *Registry) Verify(name, cred string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.nodes[name]
	return ok && rec.State != StateRejected && rec.CredentialSHA256 != "" && matches(cred, rec.CredentialSHA256)
}
