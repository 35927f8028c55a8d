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

// Admitted reports whether the name may hold a connection now: it is
// enrolled or admitted by name alone, not pending, rejected, damaged or
// released. The hub asks again once a connection is registered, because
// an admin's reject or release that landed between Admit and the
// registration could not close a connection it did not yet see.
func (r *Registry) Admitted(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.nodes[name]
	return ok && (rec.State == StateEnrolled || rec.State == StateUnbound)
}
