package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image/backend/uring"
)

// Backend is the storage under a store. See the package documentation for the
// contract of each method.
type Backend interface {
	// ReadAt reads len(p) bytes at off. For File and Device, off, len(p) and
	// the address of p must be multiples of SectorSize() (O_DIRECT). A short
	// read is an error wrapping io.ErrUnexpectedEOF.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes len(p) bytes at off, with the same rules as ReadAt. A
	// completed write may still sit in a volatile cache until Flush.
	WriteAt(p []byte, off int64) (int, error)
	// WriteAtDurable is WriteAt whose bytes are durable when it returns,
	// as if a flush covering them alone had followed (a FUA write:
	// RWF_DSYNC on the O_DIRECT descriptor, which the kernel turns into a
	// forced-unit-access write or a write and a flush). Other completed
	// writes are not made durable by it.
	WriteAtDurable(p []byte, off int64) (int, error)
	// Flush makes every completed write durable (fdatasync for files; fsync,
	// which is a cache flush, for devices).
	Flush() error
	// Discard tells the backing that [off, off+n) is unused. Best effort: an
	// error wrapping ErrUnsupported when the backing cannot; what the range
	// reads afterwards is unspecified.
	Discard(off, n int64) error
	// WriteZeroes makes [off, off+n) read as zeros.
	WriteZeroes(off, n int64) error
	// Size is the size of the backing in bytes, fixed at open.
	Size() int64
	// SectorSize is the required I/O alignment in bytes (512 or 4096).
	SectorSize() int
	// Describe names the backing for messages, e.g. `file "/srv/s.img"`.
	Describe() string
	// Close releases the descriptor and the lock. Calling it again returns nil.
	Close() error
}

// Compile-time checks that every implementation is a Backend.
var (
	_ Backend = (*File)(nil)
	_ Backend = (*Device)(nil)
	_ Backend = (*Mem)(nil)
	_ Backend = (*Crash)(nil)
)

// OpenOptions are the options of Open.
type OpenOptions struct {
	// ReadOnly opens with O_RDONLY and takes a shared lock (LOCK_SH), so
	// several read-only openers can coexist but none with a writer.
	ReadOnly bool
	// NoLock takes no lock at all (and, for block devices, no exclusive
	// claim). Only for tests that open one store twice on purpose.
	NoLock bool
	// Engine chooses how File and Device issue data reads.
	Engine Engine
}

// Open opens the regular file or block device at path for O_DIRECT I/O and
// locks it: flock(LOCK_EX|LOCK_NB), or LOCK_SH with opts.ReadOnly. A block
// device opened read-write is also opened with O_EXCL, so the kernel refuses it
// while it is mounted or claimed by another exclusive opener. A path that is
// an RBD store name (rbd:POOL/IMAGE, see RBDName) opens the RBD image
// instead, taking its exclusive lock (see the package documentation, "RBD");
// in a build without the rbd tag that fails with ErrUnsupported.
//
// Errors: a missing path wraps os.ErrNotExist; a held lock or a busy device
// wraps ErrLocked; a file on a file system without real O_DIRECT (ramfs,
// tmpfs) wraps ErrNoDirectIO;
// a directory or any other file type is refused with a message naming it.
func Open(path string, opts OpenOptions) (Backend, error) {
	if IsRBD(path) {
		return openRBD(path, opts)
	}
	// Look before opening: opening a FIFO would block, and a directory or a
	// character device deserves a clearer message than the errno open gives.
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("open %q: %w", path, err)
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFREG && kind != unix.S_IFBLK {
		return nil, fmt.Errorf("open %q: it is a %s; a store must be a regular file or a block device", path, fileTypeName(kind))
	}

	flags := unix.O_RDWR
	if opts.ReadOnly {
		flags = unix.O_RDONLY
	}
	if kind == unix.S_IFBLK && !opts.ReadOnly && !opts.NoLock {
		flags |= unix.O_EXCL
	}
	fd, err := openDirect(path, flags)
	if err != nil {
		return nil, err
	}
	b, err := newBackend(fd, path, opts)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return b, nil
}

// newBackend locks the open descriptor fd and wraps it in a File or a Device,
// chosen by fstat (the path may have changed since Open looked at it).
func newBackend(fd int, path string, opts OpenOptions) (Backend, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("open %q: fstat: %w", path, err)
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFREG && kind != unix.S_IFBLK {
		return nil, fmt.Errorf("open %q: it is a %s; a store must be a regular file or a block device", path, fileTypeName(kind))
	}
	if !opts.NoLock {
		if err := lock(fd, path, opts.ReadOnly); err != nil {
			return nil, err
		}
	}
	var d *direct
	var b Backend
	if kind == unix.S_IFBLK {
		dev, err := newDevice(fd, path, &st, opts.ReadOnly)
		if err != nil {
			return nil, err
		}
		d, b = &dev.direct, dev
	} else {
		f, err := newFile(fd, path, &st, opts.ReadOnly)
		if err != nil {
			return nil, err
		}
		d, b = &f.direct, f
	}
	if opts.Engine != EnginePread {
		ring, err := uring.New(ringEntries)
		switch {
		case err == nil:
			d.io, d.engine = ring, EngineIOUring
		case opts.Engine == EngineIOUring:
			return nil, fmt.Errorf("open %q: %w", path, err)
		default:
			d.engineNote = err.Error()
		}
	}
	return b, nil
}

// Engine is how a File or Device issues its data reads (writes are one
// pwrite each with every engine).
type Engine string

const (
	// EngineAuto is io_uring when the kernel gives one, else pread.
	EngineAuto Engine = ""
	// EngineIOUring submits the reads of concurrent callers through one
	// io_uring (package uring), so that requests arriving together reach
	// the device together: one submission, one device notification. Writes
	// stay pwrite: a small write io_uring cannot issue without blocking
	// (ext4 must update the file's times, or convert or allocate extents)
	// goes to io_uring's worker threads, which run the writes of one file
	// one at a time, so 4 KiB random writes through the ring ran well
	// below the same writes as pwrites from the callers' threads.
	// Open fails when the kernel refuses io_uring (before Linux 6.1,
	// kernel.io_uring_disabled, a seccomp filter).
	EngineIOUring Engine = "io_uring"
	// EnginePread is one pread(2) or pwrite(2) per call, on the caller's
	// thread.
	EnginePread Engine = "pread"
)

// ParseEngine parses "auto", "io_uring" or "pread".
func ParseEngine(s string) (Engine, error) {
	switch Engine(s) {
	case "auto", EngineAuto:
		return EngineAuto, nil
	case EngineIOUring, EnginePread:
		return Engine(s), nil
	}
	return "", fmt.Errorf("unknown I/O engine %q: want auto, io_uring or pread", s)
}

// EngineOf reports the engine b issues data reads with: io_uring or pread
// for File and Device (with, for pread chosen by EngineAuto, why io_uring
// was not used), librbd for RBD, "" for the test backends.
func EngineOf(b Backend) (e Engine, note string) {
	var d *direct
	switch b := b.(type) {
	case *File:
		d = &b.direct
	case *Device:
		d = &b.direct
	default:
		if e, ok := b.(interface{ engine() Engine }); ok {
			return e.engine(), ""
		}
		return "", ""
	}
	return d.engine, d.engineNote
}

// ringEntries is the depth of a backend's io_uring: more than the FUSE
// requests in flight (MaxBackground 512 is shared by every disk of a mount,
// and the ring queues what does not fit).
const ringEntries = 256

// openDirect opens path with O_DIRECT|O_CLOEXEC added to flags. It returns an
// error wrapping ErrNoDirectIO, naming the file system, when the file system
// refuses O_DIRECT (open fails with EINVAL but succeeds without O_DIRECT), and
// also for a regular file on tmpfs or ramfs, which accept O_DIRECT (tmpfs
// since Linux 6.6) but keep the data in memory: no store belongs there.
func openDirect(path string, flags int) (int, error) {
	fd, err := openRetry(path, flags|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		if fsName, inMemory := inMemoryFile(fd); inMemory {
			unix.Close(fd)
			return -1, &noDirectIOError{path: path, fsName: fsName, inMemory: true}
		}
		return fd, nil
	case errors.Is(err, unix.EBUSY) && flags&unix.O_EXCL != 0:
		return -1, fmt.Errorf("open %q: the block device is busy (mounted, part of a RAID or LVM volume, "+
			"or opened exclusively by another program): %w", path, ErrLocked)
	case errors.Is(err, unix.EINVAL):
		// Find out whether O_DIRECT is what the file system refused.
		probe, perr := openRetry(path, flags&^unix.O_EXCL|unix.O_CLOEXEC, 0)
		if perr != nil {
			return -1, fmt.Errorf("open %q: %w", path, err)
		}
		defer unix.Close(probe)
		return -1, &noDirectIOError{path: path, fsName: fileSystemName(probe)}
	default:
		return -1, fmt.Errorf("open %q: %w", path, err)
	}
}

// inMemoryFile reports whether fd is a regular file on tmpfs or ramfs, and
// names the file system. (Device nodes live on devtmpfs, which reports
// itself as tmpfs: only regular files count.)
func inMemoryFile(fd int) (string, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", false
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return "", false
	}
	if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.RAMFS_MAGIC {
		return "", false
	}
	return fileSystemName(fd), true
}

// openRetry is unix.Open retried on EINTR.
func openRetry(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// lock takes flock(LOCK_EX|LOCK_NB) on fd, or LOCK_SH when shared. The lock
// belongs to the open file description and goes away when fd is closed.
func lock(fd int, path string, shared bool) error {
	how := unix.LOCK_EX | unix.LOCK_NB
	if shared {
		how = unix.LOCK_SH | unix.LOCK_NB
	}
	for {
		err := unix.Flock(fd, how)
		switch err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		case unix.EWOULDBLOCK:
			return fmt.Errorf("open %q: %w", path, ErrLocked)
		default:
			return fmt.Errorf("open %q: flock: %w", path, err)
		}
	}
}

// fileSystemName names the file system holding fd, for messages.
func fileSystemName(fd int) string {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return "unknown"
	}
	switch fs.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	default:
		return fmt.Sprintf("type 0x%x", fs.Type)
	}
}

// fileTypeName names a file type (st_mode & S_IFMT) for messages.
func fileTypeName(kind uint32) string {
	switch kind {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFBLK:
		return "block device"
	default:
		return fmt.Sprintf("file of type 0%o", kind)
	}
}

// CreateFile creates a new sparse regular file of size bytes at path, for
// `vdisk format`. The file must not exist (O_EXCL). size must be a positive
// multiple of 4096, so that the whole file can be used with any sector size.
// The file and its directory entry are made durable, and the file is checked
// to accept O_DIRECT: on a file system that refuses it, the file is removed and
// the error wraps ErrNoDirectIO.
func CreateFile(path string, size int64) error {
	if size <= 0 || size%4096 != 0 {
		return fmt.Errorf("create %q: size %d is not a positive multiple of 4096", path, size)
	}
	fd, err := openRetry(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %q: %w", path, err)
	}
	if err := initFile(fd, path, size); err != nil {
		os.Remove(path)
		return fmt.Errorf("create %q: %w", path, err)
	}
	// Refuse a file system without O_DIRECT now rather than at the first Open.
	probe, err := openDirect(path, unix.O_RDWR)
	if err != nil {
		os.Remove(path)
		return err
	}
	unix.Close(probe)
	return nil
}

// initFile sets the size of the new file fd, makes the file and its directory
// entry durable, and closes fd.
func initFile(fd int, path string, size int64) error {
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("truncate to %d bytes: %w", size, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	dir := filepath.Dir(path)
	dfd, err := openRetry(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory %q: %w", dir, err)
	}
	defer unix.Close(dfd)
	if err := unix.Fsync(dfd); err != nil {
		return fmt.Errorf("fsync directory %q: %w", dir, err)
	}
	return nil
}
