package main

// One way for a command to reach a store, mounted or not.
//
// ls, info, fsck, create, rm, rename, resize, import, export and defrag
// take a store's path or the mount point of a mounted store. openAccess
// decides from the argument:
//
//   - a vdiskfs mount point: the store is mounted, and the command goes
//     through the mount;
//   - the path of a store that a live daemon has mounted in this mount
//     namespace (a vdiskfs mount's source is the store, in
//     /proc/self/mountinfo, and the store's owner record names a running
//     mount daemon that has it mounted there): the same, through that
//     mount;
//   - anything else: the command opens the store itself (a store held by
//     any other process is refused as locked, naming the holder).
//
// Through a mount, the catalog (ls, info, fsck's check) and defrag are
// asked of the daemon through the mount's control socket (telemetry.List,
// Info, Check, Defrag), and disks are changed and read on the mount's
// files (create and ftruncate, unlink, rename, truncate; import writes and
// fsyncs the file it created, export reads its data regions): that is what
// the kernel sees, so its caches stay right, and the mount's permission
// checks apply to the caller. A repair needs the store unmounted: fsck
// --repair on a mounted store is refused, saying so. upgrade and format
// need it unmounted too.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

// storeAccess is what the commands do to a store: one implementation opens
// the store (offlineStore), the other goes through its mount
// (mountedStore). Errors name the disk; those of a mounted store are the
// mount's (os.PathError) or the daemon's.
type storeAccess interface {
	// List lists every disk, sorted by name.
	List() ([]image.DiskInfo, error)
	// Info describes the store, with its format version.
	Info() (telemetry.StoreInfo, error)
	// Create makes an empty disk of size bytes with permission bits mode,
	// owned by the caller, and opens it for writing whatever its mode; it
	// fails if name exists.
	Create(name string, size int64, mode uint32) (diskData, error)
	// Open opens the disk name for reading.
	Open(name string) (diskData, error)
	// Remove removes the disk name.
	Remove(name string) error
	// Rename renames disk old to new, replacing a disk called new only
	// when replace is set (else it fails matching image.ErrExist).
	Rename(old, new string, replace bool) error
	// Size is the size of disk name.
	Size(name string) (int64, error)
	// Resize sets the size of disk name.
	Resize(name string, size int64) error
	// Defrag moves disk name into contiguous blocks (image.Store.Defrag);
	// progress, when not nil, is told how far the copy is (offline only).
	Defrag(name string, progress func(done, total uint64)) (image.DefragResult, error)
	// Close lets go of the store: an offline store is committed and
	// closed.
	Close() error
}

// diskData is the bytes of one disk: a handle on a store this process
// opened, or the disk's file on the mount.
type diskData interface {
	io.ReaderAt
	io.WriterAt
	// Size is the disk's size when it was opened.
	Size() int64
	// Regions calls fn with each data region [start, end) of the disk, in
	// order (SEEK_DATA and SEEK_HOLE).
	Regions(fn func(start, end int64) error) error
	// Close closes the disk; what was written is durable when it returns
	// without an error (a file on the mount is fsynced first; a store this
	// process opened commits when it is closed).
	Close() error
}

// mountOf reports whether arg is a vdiskfs mount point, or the path of a
// store a live daemon has mounted in this mount namespace, and returns the
// mount point (as the mount table spells it) and the store (the mount's
// source).
func mountOf(arg string) (mnt, store string, ok bool) {
	if abs, err := canonicalMountpoint(arg); err == nil {
		if m, found, err := findMount(abs); err == nil && found {
			if !isVdiskMount(m) {
				return "", "", false
			}
			return abs, m.source, true
		}
	}
	// Only a store that a vdiskfs mount here names as its source is asked
	// for its owner record: the common case, a store nothing mounts, costs
	// one read of the mount table.
	mnt, found, err := storeMountpoint(0, arg)
	if err != nil || !found {
		return "", "", false
	}
	// A dead daemon's mount still names the store, but holds it no more:
	// the store is opened then. A daemon in another mount namespace names
	// another mount point, whose socket is not this one's.
	if at, live := mountedAt(arg); !live || at != mnt {
		return "", "", false
	}
	m, _, err := findMount(mnt)
	if err != nil {
		return "", "", false
	}
	return mnt, m.source, true
}

// openAccess returns how command cmd reaches the store arg names (the top
// of this file): through its mount, or by opening it, read-only when
// readOnly.
func (e *env) openAccess(arg, cmd string, readOnly bool) (storeAccess, error) {
	if mnt, store, ok := mountOf(arg); ok {
		return mountedStore{mnt: mnt, store: store}, nil
	}
	s, err := e.openStore(arg, cmd, readOnly)
	if err != nil {
		if fi, serr := os.Stat(arg); serr == nil && fi.IsDir() {
			return nil, fmt.Errorf("%w (%s is no vdiskfs mount point: give a store, or the mount point of a mounted one)", err, arg)
		}
		return nil, err
	}
	return offlineStore{s}, nil
}

// closeAccess closes a like closeStore.
func (e *env) closeAccess(a storeAccess, errp *error) { e.closeReporting(a, "store", errp) }

// offlineStore is a store this process opened.
type offlineStore struct{ s *image.Store }

func (o offlineStore) List() ([]image.DiskInfo, error) { return o.s.List(), nil }

func (o offlineStore) Info() (telemetry.StoreInfo, error) {
	return telemetry.StoreInfo{Info: o.s.Info(), Version: o.s.Version()}, nil
}

func (o offlineStore) Create(name string, size int64, mode uint32) (diskData, error) {
	if _, err := o.s.Create(name, size, image.Attr{Mode: mode, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}); err != nil {
		return nil, err
	}
	return o.Open(name)
}

func (o offlineStore) Open(name string) (diskData, error) {
	d, err := o.s.OpenDisk(name)
	if err != nil {
		return nil, err
	}
	return offlineDisk{d}, nil
}

func (o offlineStore) Remove(name string) error { return o.s.Remove(name) }

func (o offlineStore) Rename(old, new string, replace bool) error {
	if _, err := o.s.Stat(old); err != nil {
		return err
	}
	if _, err := o.s.Stat(new); err == nil && old != new && !replace {
		return fmt.Errorf("rename %q: %q: %w", old, new, image.ErrExist)
	}
	return o.s.Rename(old, new)
}

func (o offlineStore) Size(name string) (int64, error) {
	info, err := o.s.Stat(name)
	return info.Size, err
}

func (o offlineStore) Resize(name string, size int64) (err error) {
	d, err := o.s.OpenDisk(name)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := d.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close disk: %w", cerr)
		}
	}()
	return d.Truncate(size)
}

func (o offlineStore) Defrag(name string, progress func(done, total uint64)) (image.DefragResult, error) {
	return o.s.Defrag(name, progress)
}

func (o offlineStore) Close() error { return o.s.Close() }

// offlineDisk is a disk of a store this process opened.
type offlineDisk struct{ *image.Disk }

func (d offlineDisk) Regions(fn func(start, end int64) error) error {
	return diskDataRegions(d.Disk, fn)
}

// mountedStore is a store served by a daemon at mnt: the catalog is read
// through the mount's socket, changes are made on the mount's files.
type mountedStore struct{ mnt, store string }

func (m mountedStore) List() ([]image.DiskInfo, error)    { return telemetry.List(m.mnt) }
func (m mountedStore) Info() (telemetry.StoreInfo, error) { return telemetry.Info(m.mnt) }

// path is the file of disk name on the mount. The name is checked first:
// a name holding "/" or "..", taken as a path, would reach outside the
// mount.
func (m mountedStore) path(name string) (string, error) {
	if err := image.ValidateName(name); err != nil {
		return "", fmt.Errorf("disk %q: %w", name, err)
	}
	return filepath.Join(m.mnt, name), nil
}

// Create creates the file and sets its size and mode through the open
// descriptor, so that the disk can be written whatever its mode; a failure
// after the create removes the file.
func (m mountedStore) Create(name string, size int64, mode uint32) (diskData, error) {
	p, err := m.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(size)
	if err == nil {
		err = unix.Fchmod(int(f.Fd()), mode&0o7777)
	}
	if err != nil {
		f.Close()
		os.Remove(p)
		return nil, err
	}
	return &mountFile{f: f, size: size, write: true}, nil
}

func (m mountedStore) Open(name string) (diskData, error) {
	p, err := m.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &mountFile{f: f, size: fi.Size()}, nil
}

// mountFile is a disk's file on the mount.
type mountFile struct {
	f     *os.File
	size  int64
	write bool // opened for writing: Close fsyncs
}

func (d *mountFile) ReadAt(p []byte, off int64) (int, error)  { return d.f.ReadAt(p, off) }
func (d *mountFile) WriteAt(p []byte, off int64) (int, error) { return d.f.WriteAt(p, off) }
func (d *mountFile) Size() int64                              { return d.size }

func (d *mountFile) Regions(fn func(start, end int64) error) error {
	return fileDataRegions(d.f, d.size, true, fn)
}

func (d *mountFile) Close() error {
	var err error
	if d.write {
		err = d.f.Sync()
	}
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (m mountedStore) Remove(name string) error {
	p, err := m.path(name)
	if err != nil {
		return err
	}
	return os.Remove(p)
}

// Rename without replace uses RENAME_NOREPLACE, which the mount checks
// under the directory's lock: no disk called new can appear in between.
func (m mountedStore) Rename(old, new string, replace bool) error {
	po, err := m.path(old)
	if err != nil {
		return err
	}
	pn, err := m.path(new)
	if err != nil {
		return err
	}
	if replace || old == new {
		return os.Rename(po, pn)
	}
	err = unix.Renameat2(unix.AT_FDCWD, po, unix.AT_FDCWD, pn, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("rename %q: %q: %w", old, new, image.ErrExist)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: po, New: pn, Err: err}
	}
	return nil
}

func (m mountedStore) Size(name string) (int64, error) {
	p, err := m.path(name)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (m mountedStore) Resize(name string, size int64) error {
	p, err := m.path(name)
	if err != nil {
		return err
	}
	return os.Truncate(p, size)
}

// Defrag asks the daemon, which moves the blocks under the disk's range
// lock while the disk may be in use; the bytes do not change, so the
// kernel's caches stay right.
func (m mountedStore) Defrag(name string, _ func(done, total uint64)) (image.DefragResult, error) {
	return telemetry.Defrag(m.mnt, name)
}

func (m mountedStore) Close() error { return nil }
