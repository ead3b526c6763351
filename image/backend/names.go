package backend

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// What a store name may name, beside Open: a regular file, a block device,
// or an RBD image (rbd:POOL/IMAGE). Format creates the backing when it is
// missing, and removes what it created when formatting fails.

// Kind is the kind of a store's backing.
type Kind string

const (
	KindFile   Kind = "regular file"
	KindDevice Kind = "block device"
	KindRBD    Kind = "rbd image"
)

// Info is what Stat says of a backing.
type Info struct {
	Kind Kind
	Size int64 // bytes
}

// Stat describes the backing name names without opening it for I/O or
// locking it. A missing file or RBD image wraps os.ErrNotExist; anything
// but a regular file, a block device or an RBD image is an error naming it.
func Stat(name string) (Info, error) {
	if IsRBD(name) {
		return statRBD(name)
	}
	var st unix.Stat_t
	if err := unix.Stat(name, &st); err != nil {
		return Info{}, fmt.Errorf("stat %q: %w", name, err)
	}
	switch kind := st.Mode & unix.S_IFMT; kind {
	case unix.S_IFREG:
		return Info{Kind: KindFile, Size: st.Size}, nil
	case unix.S_IFBLK:
		return Info{Kind: KindDevice, Size: -1}, nil // the size needs an open: BLKGETSIZE64
	default:
		return Info{}, fmt.Errorf("%q is a %s; a store must be a regular file, a block device or an RBD image", name, fileTypeName(kind))
	}
}

// Create makes a new backing of size bytes for a store: a sparse file
// (CreateFile), or an RBD image with the exclusive-lock feature. It wraps
// os.ErrExist when the file or image exists already.
func Create(name string, size int64) error {
	if !IsRBD(name) {
		return CreateFile(name, size)
	}
	if size <= 0 || size%4096 != 0 {
		return fmt.Errorf("create %s: size %d is not a positive multiple of 4096", name, size)
	}
	return createRBD(name, size)
}

// Remove deletes a backing Create made: the file, or the RBD image.
func Remove(name string) error {
	if IsRBD(name) {
		return removeRBD(name)
	}
	return os.Remove(name)
}

// BreakLock takes the lock of an RBD store from whoever holds it: librbd
// first has the cluster blocklist the holder, so that it can never write
// to the image again, then breaks the lock. It returns the holders it
// broke (none when the lock was free). A file or block device has no lock
// to break (its flock goes with its holder's process): BreakLock refuses.
func BreakLock(name string) ([]string, error) {
	if !IsRBD(name) {
		return nil, fmt.Errorf("%s: only an RBD store's lock can be broken; a file's or a device's lock goes away with the process holding it: %w",
			name, ErrUnsupported)
	}
	return breakRBDLock(name)
}

// FencesOtherHosts reports whether b's lock holds across hosts and was
// granted only after its previous holder could no longer write (an RBD
// image opened read-write: the exclusive lock of a dead or broken holder
// passes on only once the cluster has blocklisted it). A store on such a
// backing need not trust its owner record to keep a second host out.
func FencesOtherHosts(b Backend) bool {
	f, ok := b.(interface{ fencesOtherHosts() bool })
	return ok && f.fencesOtherHosts()
}

// LockHolder names the client b holds its lock as, for a backend whose
// lock has holders with names (RBD: "client.4133 at 127.0.0.1:0/4956"),
// and "" for any other.
func LockHolder(b Backend) string {
	if h, ok := b.(interface{ LockHolder() string }); ok {
		return h.LockHolder()
	}
	return ""
}
