//go:build !rbd

package fs

import "testing"

// rbdTestStore: only a build with the rbd tag runs the suite on RBD.
func rbdTestStore(testing.TB) string { return "" }

// rbdCrashCopy is never called without the rbd tag: no store is on RBD.
func rbdCrashCopy(t testing.TB, src string) string {
	t.Fatalf("%s: an RBD store in a build without the rbd tag", src)
	return ""
}
