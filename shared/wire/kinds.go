package wire

import "slices"

// maxKindName bounds an engine kind's name.
const maxKindName = 32

// IsKindName tells whether s can name an engine kind: 1 to 32 lower-case
// letters, digits, '-' or '_', starting with a letter. A coordinator
// accepts such a kind even when it does not know it (an agent newer than
// the coordinator), and shows it as unknown (KnownKind).
func IsKindName(s string) bool {
	if s == "" || len(s) > maxKindName || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// KnownKind tells whether this build knows engine kind s.
func KnownKind(s string) bool { return slices.Contains(EngineKinds, s) }
