// Package tcgguest prepares and boots the small QEMU guests that the
// end-to-end tests (tests/e2e) and the compare tool's guest targets run:
// Debian's stock kernel (only the image and the virtio modules, taken out
// of its package without installing it), Debian's static busybox, an
// initramfs written here in the newc cpio format with a generated /init,
// and QEMU run with the guest's serial console read line by line.
//
// # Cache
//
// Downloads (the kernel, busybox) are kept between runs in a Cache's
// directory, by default DefaultCacheDir. An entry is written into a
// temporary directory and renamed into place, its last file written last,
// so a cache is never half filled; deleting the directory fetches them
// again.
//
// # Concurrency
//
// Apt serializes its own apt-get runs (its mutex also guards whether the
// package lists were updated). Everything else is plain functions and
// values without shared state: a Cache may be used from several
// goroutines only if its Apt may, and two processes filling one cache
// directory at once each write their own temporary entry and the last
// rename wins.
package tcgguest
