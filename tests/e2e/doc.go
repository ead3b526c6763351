// Package e2e drives vdiskfs with real clients, end to end, through the
// real `vdisk` binary: a QEMU guest writing to a virtio disk, ext4 on a
// loop device, and fio with verification. Everything is in the tests
// (go test ./tests/e2e); see README.md in this directory for what runs,
// how long it takes and what it needs.
package e2e
