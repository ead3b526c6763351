//go:build !rbd

package testutil

// rbdTag: the tests are built with the tag rbd, and so is the vdisk they run.
const rbdTag = false
