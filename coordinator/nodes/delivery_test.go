package nodes

import "testing"

// A credential whose connection ended before the agent read it is taken
// back, so the agent's next connection, which comes without it, enrols
// again instead of being refused until an admin releases the name. A
// delivered credential, or one presented since, stays the node's.
func TestUndeliveredCredentialIsTakenBack(t *testing.T) {
	r, st, _ := newRegistry(t, DefaultConfig())

	// A new name: forgotten, in memory and in the store.
	d := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true})
	if d.Outcome != Accept || d.Credential == "" {
		t.Fatalf("enrol: %+v", d)
	}
	r.Delivered("gpu-a", d.Credential, false)
	if _, ok := r.Get("gpu-a"); ok {
		t.Error("a name whose credential never reached its agent is remembered")
	}
	if _, ok := st.recs["gpu-a"]; ok {
		t.Error("its stored record is kept")
	}
	again := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true})
	if again.Outcome != Accept || again.Credential == "" || again.Credential == d.Credential {
		t.Fatalf("the agent's next connection: %+v, want a new enrolment", again)
	}

	// Delivered: settled for good, a later "not delivered" changes nothing.
	r.Delivered("gpu-a", again.Credential, true)
	r.Delivered("gpu-a", again.Credential, false)
	if got := r.Admit(Hello{Node: "gpu-a", KeepsCredential: true}); got.Outcome != Refuse || got.Label != LabelCredential {
		t.Errorf("a connection without the delivered credential: %+v", got)
	}

	// Presented on another connection before the first one ended: kept.
	d = r.Admit(Hello{Node: "gpu-b", KeepsCredential: true})
	if got := r.Admit(Hello{Node: "gpu-b", Credential: d.Credential, KeepsCredential: true}); got.Outcome != Accept {
		t.Fatalf("presenting the credential: %+v", got)
	}
	r.Delivered("gpu-b", d.Credential, false)
	if rec, ok := r.Get("gpu-b"); !ok || rec.CredentialSHA256 != hash(d.Credential) {
		t.Errorf("a presented credential was taken back: %+v", rec)
	}

	// Binding an unbound name: unbound again, as it was.
	if got := r.Admit(Hello{Node: "gpu-old", Address: "10.0.0.7"}); got.Outcome != Accept || got.Credential != "" {
		t.Fatalf("an old agent: %+v", got)
	}
	d = r.Admit(Hello{Node: "gpu-old", KeepsCredential: true, Address: "10.0.0.7"}) // from where it enrolled
	if d.Credential == "" || st.recs["gpu-old"].State != StateEnrolled {
		t.Fatalf("binding: %+v, stored %+v", d, st.recs["gpu-old"])
	}
	r.Delivered("gpu-old", d.Credential, false)
	rec, _ := r.Get("gpu-old")
	if rec.State != StateUnbound || rec.CredentialSHA256 != "" || st.recs["gpu-old"].State != StateUnbound {
		t.Errorf("after taking back a binding: %+v, stored %+v", rec, st.recs["gpu-old"])
	}

	// Another credential than the one handed out is ignored.
	d = r.Admit(Hello{Node: "gpu-c", KeepsCredential: true})
	r.Delivered("gpu-c", NewCredential(), false)
	if _, ok := r.Get("gpu-c"); !ok {
		t.Error("settling a credential that was not handed out took the name back")
	}
}
