package nodes

// An unbound name (known from before node credentials, or enrolled by an
// agent that keeps none) is accepted by name. Binding it to a credential
// makes it the binder's alone, so it is not handed to whoever asks first:
// an agent that keeps a credential binds it from BindFrom, the address the
// name enrolled from unbound, or once an admin approved the bind
// (Approve on an unbound name: POST /api/v1/nodes/NAME/approve). Names an
// upgrade brought (a schema-1 state, or records from before BindFrom)
// have no such address: binding them is an admin's act. Until then the
// agent is served unbound, as before, and no credential is handed out.

// mayBind reports whether the connection h may bind the unbound rec.
func (r *Registry) mayBind(rec *Record, h Hello) bool {
	if rec.BindApproved || (rec.BindFrom != "" && rec.BindFrom == clip(h.Address)) {
		return true
	}
	r.log.Warn("an agent that keeps a credential asks to bind an unbound node name from another address than it enrolled from; "+
		"serving it unbound until an admin approves the bind (POST /api/v1/nodes/NAME/approve)",
		"node", rec.Name, "address", h.Address, "enrolled_from", rec.BindFrom)
	return false
}
