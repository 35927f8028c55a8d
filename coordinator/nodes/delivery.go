package nodes

// handout is a credential Admit handed out (by its hash) and the record
// the name had before it (nil: the name was new).
type handout struct {
	hash   string
	before *Record
}

// Delivered settles a credential Admit handed out for name: delivered
// once the agent is known to hold it, not delivered when the connection
// that carried it ended before that. An undelivered credential is taken
// back (a new name is forgotten, a bound name is unbound again, as before
// Admit), since no agent may hold it: otherwise the agent's next
// connection would come without it and be refused until an admin
// released the name. A coordinator that stored slowly (a large fleet
// enrolling at once, a busy disk) did that to agents whose first
// connection ended while their enrolment was being written. A record
// that changed since (an admin acted, or the credential was presented on
// another connection) is left as it is.
func (r *Registry) Delivered(name, credential string, delivered bool) {
	r.mu.Lock()
	h, ok := r.handed[name]
	if !ok || h.hash != hash(credential) {
		r.mu.Unlock()
		return
	}
	delete(r.handed, name)
	cur, ok := r.nodes[name]
	if delivered || !ok || cur.CredentialSHA256 != h.hash || r.enrolling[name] {
		r.mu.Unlock()
		return
	}
	// Memory first: the agent may be connecting again while a slow store
	// writes. Should the write fail, the store keeps a record no agent
	// can use; the log says so.
	var err error
	if h.before == nil {
		delete(r.nodes, name)
		delete(r.savedSeen, name)
		r.mu.Unlock()
		err = r.st.DeleteNode(name)
	} else {
		prev := *h.before
		prev.LastSeen = cur.LastSeen
		r.nodes[name] = &prev
		r.mu.Unlock()
		err = r.st.SaveNode(prev)
	}
	if err != nil {
		r.log.Warn("could not store that a node credential never reached its agent: after a restart an admin may have to release the name",
			"node", name, "error", err)
		return
	}
	r.log.Info("node credential taken back: the connection it was handed to ended before its agent had it", "node", name)
}
