package verbstest

import (
	"os"
	"testing"
)

// RequireEnv names the variable that makes a missing device a failure:
// RSOCK_REQUIRE_VERBS lists the devices the run is about (for example
// "rxe0,siw0" in the Soft-RoCE VM). When it is set, a verbs test that
// finds no usable device fails instead of skipping, so a run cannot pass
// by testing nothing.
const RequireEnv = "RSOCK_REQUIRE_VERBS"

// Unavailable ends a test that cannot run for want of a verbs device:
// skipped with the reason, or failed when RequireEnv is set.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if req := os.Getenv(RequireEnv); req != "" {
		t.Fatalf("verbs required (%s=%s) but unavailable: %s", RequireEnv, req, reason)
	}
	t.Skip(reason)
}
