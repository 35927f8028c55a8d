package coord

// SameCoordinator is the redirect policy, for tests.
var SameCoordinator = sameCoordinator
