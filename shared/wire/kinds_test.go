package wire

import "testing"

// An agent newer than its coordinator may report a kind the coordinator
// does not know: the snapshot is accepted, the kind kept as sent.
func TestUnknownKindAccepted(t *testing.T) {
	e := Engine{Kind: "tgi", URL: "http://127.0.0.1:8080", CapacityKey: "k"}
	if err := e.Validate(); err != nil {
		t.Fatalf("unknown kind refused: %v", err)
	}
	if KnownKind("tgi") || !KnownKind(EngineSGLang) {
		t.Fatal("KnownKind")
	}
	for _, bad := range []string{"", "TGI", "tgi server", "9x", "a/b", "x" + string(make([]byte, 40))} {
		if IsKindName(bad) {
			t.Errorf("%q taken for a kind name", bad)
		}
	}
}
