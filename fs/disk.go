package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// diskNode is the inode of one disk. Its identity is the disk's store id,
// which survives renames and is never reused; the name is only a hint for
// requests that come without an open file, checked against the id on
// every use.
type diskNode struct {
	gofs.Inode
	vfs  *vfs
	id   uint64                 // immutable
	name atomic.Pointer[string] // last known name; may be stale
}

var (
	_ = (gofs.InodeEmbedder)((*diskNode)(nil))
	_ = (gofs.NodeOpener)((*diskNode)(nil))
	_ = (gofs.NodeGetattrer)((*diskNode)(nil))
	_ = (gofs.NodeSetattrer)((*diskNode)(nil))
	_ = (gofs.NodeStatfser)((*diskNode)(nil))
	_ = (gofs.NodeCopyFileRanger)((*diskNode)(nil))
)

func (n *diskNode) setName(name string) { n.name.Store(&name) }

// info describes the disk through its name, and, if the name hint is
// stale (renamed or replaced meanwhile), by looking for the id in the
// catalog. ErrNotExist once the disk has no name.
func (n *diskNode) info() (image.DiskInfo, error) {
	if p := n.name.Load(); p != nil {
		if info, err := n.vfs.store.Stat(*p); err == nil && info.ID == n.id {
			return info, nil
		}
	}
	for _, info := range n.vfs.store.List() {
		if info.ID == n.id {
			n.setName(info.Name)
			return info, nil
		}
	}
	return image.DiskInfo{}, fmt.Errorf("disk id %d: %w", n.id, image.ErrNotExist)
}

// open opens a new handle on the disk, making sure it is this node's disk
// (a rename may move names between the lookup and the open).
func (n *diskNode) open() (*image.Disk, error) {
	var err error
	for try := 0; try < 3; try++ {
		var info image.DiskInfo
		if info, err = n.info(); err != nil {
			return nil, err
		}
		var h *image.Disk
		if h, err = n.vfs.store.OpenDisk(info.Name); err != nil {
			if errors.Is(err, image.ErrNotExist) {
				continue
			}
			return nil, err
		}
		if h.ID() == n.id {
			return h, nil
		}
		h.Close()
		err = fmt.Errorf("disk id %d: renamed while opening: %w", n.id, image.ErrNotExist)
	}
	return nil, err
}

func (n *diskNode) fields() logrus.Fields {
	f := logrus.Fields{"disk_id": n.id}
	if p := n.name.Load(); p != nil {
		f["disk"] = *p
	}
	return f
}

// withHandle runs fn on a handle of this disk: the request's own file
// handle if it has one, else a handle opened for the call, else (the disk
// was unlinked while open) the handle of any open file of this node.
func (n *diskNode) withHandle(f gofs.FileHandle, fn func(*image.Disk) error) error {
	if df, ok := f.(*diskFile); ok && df != nil {
		return fn(df.disk)
	}
	h, err := n.open()
	if err == nil {
		defer h.Close()
		return fn(h)
	}
	if !errors.Is(err, image.ErrNotExist) {
		return err
	}
	if found, ferr := n.vfs.withOpenHandle(n, fn); found {
		return ferr
	}
	return err
}

// Getattr describes the disk.
func (n *diskNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var info image.DiskInfo
	if df, ok := f.(*diskFile); ok && df != nil {
		info = df.disk.Stat()
	} else {
		var err error
		if info, err = n.info(); err != nil {
			err = n.withHandle(nil, func(h *image.Disk) error { info = h.Stat(); return nil })
			if err != nil {
				return n.vfs.toErrno(err, "getattr", n.fields())
			}
		}
	}
	n.vfs.fillAttr(&out.Attr, info)
	return 0
}

// Setattr changes the size (truncate) and the mode, owner and times.
func (n *diskNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	var info image.DiskInfo
	resized := false
	err := n.withHandle(f, func(h *image.Disk) error {
		if size, ok := in.GetSize(); ok {
			if size > math.MaxInt64 {
				return fmt.Errorf("truncate to %d: %w", size, image.ErrTooLarge)
			}
			if err := h.Truncate(int64(size)); err != nil {
				return err
			}
			resized = true
		}
		var c image.AttrChange
		change := false
		if mode, ok := in.GetMode(); ok {
			c.Mode, change = &mode, true
		}
		if uid, ok := in.GetUID(); ok {
			c.UID, change = &uid, true
		}
		if gid, ok := in.GetGID(); ok {
			c.GID, change = &gid, true
		}
		if at, ok := in.GetATime(); ok {
			c.Atime, change = &at, true
		}
		if mt, ok := in.GetMTime(); ok {
			c.Mtime, change = &mt, true
		}
		if change {
			if err := h.SetAttr(c); err != nil {
				return err
			}
		}
		info = h.Stat()
		return nil
	})
	if resized {
		n.vfs.vhost.resized(n.id) // before the error: a mode change may fail after the truncate
	}
	if err != nil {
		return n.vfs.toErrno(err, "setattr", n.fields())
	}
	n.vfs.fillAttr(&out.Attr, info)
	return 0
}

// Statfs describes the whole store.
func (n *diskNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.vfs.statfs(out)
}

// Open opens a handle on the disk. O_TRUNC (sent because the mount asks
// for atomic O_TRUNC) empties it, as cp and dd expect.
func (n *diskNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	h, err := n.open()
	if err != nil {
		return nil, 0, n.vfs.toErrno(err, "open", n.fields())
	}
	if err := openableFor(h, flags); err != nil {
		h.Close()
		return nil, 0, n.vfs.toErrno(err, "open", n.fields())
	}
	if flags&syscall.O_TRUNC != 0 {
		if err := h.Truncate(0); err != nil {
			h.Close()
			return nil, 0, n.vfs.toErrno(err, "open", n.fields())
		}
	}
	f, fuseFlags, e := n.vfs.newFile(n, h, flags)
	if e != 0 {
		return nil, 0, e
	}
	return f, fuseFlags, 0
}

// openableFor refuses an open for writing (O_WRONLY, O_RDWR) of a
// snapshot with image.ErrReadOnlyDisk (EROFS), as a read-only file system
// refuses it: a snapshot never has a handle that could write, so writes,
// fallocate and copies into it fail at the open already (EROFS for the
// caller, not EBADF later). Read-only opens, and chmod, chown and utimes
// of a snapshot, are allowed: its attributes are not its data.
//
// An encrypted disk whose key has not been given is refused any open with
// image.ErrLocked (ENOKEY, logged with the disk's name): it has no data to
// show.
func openableFor(h *image.Disk, flags uint32) error {
	info := h.Stat()
	if info.Locked {
		return fmt.Errorf("open disk %q: %w", info.Name, image.ErrLocked)
	}
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return nil
	}
	if info.Snapshot {
		return fmt.Errorf("open disk %q for writing: %w", info.Name, image.ErrReadOnlyDisk)
	}
	return nil
}

// maxCopyChunk bounds the bytes one COPY_FILE_RANGE copies. The reply's
// count is 32 bits (fuse_write_out.size); a kernel that predates
// FUSE_COPY_FILE_RANGE_64 (before 6.18; go-fuse v2.12 answers that opcode
// ENOSYS, and the kernel falls back to the 32-bit one with the length
// clamped to 4 GiB - 4 KiB) may ask for more, and a count cut to 32 bits
// would be a lie about what was copied. A multiple of every block size, so
// a copy that continues where the last one stopped keeps its offsets
// placed alike in their blocks; 1 GiB is also the chunk cp asks for.
const maxCopyChunk = 1 << 30

// CopyFileRange copies between two open disks of the store, or within one:
// image.Disk.CopyFrom, which shares whole blocks (no data I/O, the map
// records the sharing) when both offsets sit at the same place in their
// blocks and copies the bytes otherwise. It copies at most maxCopyChunk
// bytes, fewer when the source ends first (0 at or past its end), grows
// the target like a write, and returns the count; the kernel and its
// callers (cp, qemu-img convert -C) loop on a short count. A copy that
// failed after some bytes answers that count, as a short write does: the
// disk holds them. On a target opened with O_SYNC or O_DSYNC the copy is
// durable before the reply, as for fallocate. Overlapping ranges of one
// disk are EINVAL (the kernel refuses them first); a snapshot target is
// EROFS (it cannot be open for writing). Copies between mounts never reach
// us: the kernel copies them through its splice path.
func (n *diskNode) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	src, okIn := fhIn.(*diskFile)
	dst, okOut := fhOut.(*diskFile)
	if !okIn || !okOut || src == nil || dst == nil {
		return 0, syscall.EBADF // the kernel sends open files of this mount only
	}
	if flags != 0 || offIn > math.MaxInt64 || offOut > math.MaxInt64 {
		return 0, syscall.EINVAL
	}
	length = min(length, maxCopyChunk)
	fields := func() logrus.Fields {
		return dst.fields("src_disk_id", src.node.id, "src_offset", offIn, "offset", offOut, "length", length)
	}
	copied, err := dst.disk.CopyFrom(src.disk, int64(offIn), int64(offOut), int64(length))
	if err != nil && copied == 0 {
		return 0, n.vfs.toErrno(err, "copy_file_range", fields())
	}
	if derr := n.vfs.makeDurable(dst.sync); derr != nil {
		return 0, n.vfs.toErrno(derr, "copy_file_range", fields())
	}
	if err != nil {
		// Short: the bytes copied are the disk's now; the caller's next
		// call starts after them and meets the error again.
		n.vfs.log.WithFields(fields()).WithField("copied", copied).WithError(err).Debug("copy_file_range stopped short")
	}
	return uint32(copied), 0
}

// diskFile is an open file: one image.Disk handle, closed on Release. Its
// fields never change after Open; image.Disk is safe for concurrent use,
// so the I/O methods run in parallel without a lock of ours (overlapping
// writes are ordered by the disk's range lock in package image).
type diskFile struct {
	vfs  *vfs
	node *diskNode
	disk *image.Disk
	sync syncMode // from the open flags: what a fallocate must make durable
	pins int      // owner requests (ownerIO) and withOpenHandle calls using disk; guarded by vfs.mu
}

var (
	_ = (gofs.FileReader)((*diskFile)(nil))
	_ = (gofs.FileWriter)((*diskFile)(nil))
	_ = (gofs.FileFsyncer)((*diskFile)(nil))
	_ = (gofs.FileFlusher)((*diskFile)(nil))
	_ = (gofs.FileReleaser)((*diskFile)(nil))
	_ = (gofs.FileAllocater)((*diskFile)(nil))
	_ = (gofs.FileLseeker)((*diskFile)(nil))
)

// newFile wraps an opened handle and chooses the open flags.
func (v *vfs) newFile(n *diskNode, h *image.Disk, flags uint32) (*diskFile, uint32, syscall.Errno) {
	f := &diskFile{vfs: v, node: n, disk: h, sync: syncModeOf(flags)}
	if !v.register(f) {
		h.Close()
		return nil, 0, syscall.EIO
	}
	if flags&syscall.O_DIRECT != 0 {
		return f, v.directFlags, 0
	}
	return f, v.bufferedFlags, 0
}

func (f *diskFile) fields(kv ...any) logrus.Fields {
	fl := f.node.fields()
	for i := 0; i+1 < len(kv); i += 2 {
		fl[kv[i].(string)] = kv[i+1]
	}
	return fl
}

// Read reads into the request's own buffer (go-fuse pools it, 4 KiB
// aligned; with FUSE-over-io_uring it is the ring entry's payload buffer,
// page-aligned), so image reads block-aligned requests straight into it
// and the reply needs no copy (inPlace). A read that reaches the end of the
// disk is short; at or past the end, empty.
func (f *diskFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.disk.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, f.vfs.toErrno(err, "read", f.fields("offset", off, "length", len(dest)))
	}
	return inPlace(dest[:n]), 0
}

// inPlace is a read result already in the reply buffer. go-fuse copies a
// ReadResultData into the reply even when it is the reply buffer (a 1 MiB
// memmove onto itself); a result with only Bytes is taken as the payload,
// and one that is the reply buffer is not copied.
type inPlace []byte

func (r inPlace) Bytes([]byte) ([]byte, fuse.Status) { return r, fuse.OK }
func (r inPlace) Size() int                          { return len(r) }
func (r inPlace) Done()                              {}

// Write writes the request's payload, growing the disk when it ends past
// the size. go-fuse hands the payload 4 KiB aligned, so aligned writes go
// to the backend without a copy.
func (f *diskFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.disk.WriteAt(data, off)
	if err != nil {
		return 0, f.vfs.toErrno(err, "write", f.fields("offset", off, "length", len(data)))
	}
	return uint32(n), 0
}

// Fsync makes every acknowledged write durable, data and map; fsync
// also the times, fdatasync (FUSE_FSYNC_FDATASYNC) not.
func (f *diskFile) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	sync := f.disk.Sync
	if flags&fsyncFdatasync != 0 {
		sync = f.disk.SyncData
	}
	if err := sync(); err != nil {
		return f.vfs.toErrno(err, "fsync", f.fields())
	}
	return 0
}

// Flush (close(2)) commits nothing: durability is fsync's promise, and
// writes are not buffered here, so there is no late error to report. The
// open flags include FOPEN_NOFLUSH, so the kernel does not even ask.
func (f *diskFile) Flush(ctx context.Context) syscall.Errno { return 0 }

// Release closes the handle. go-fuse calls it after every other request on
// the handle has returned. The last close of an unlinked disk frees it.
func (f *diskFile) Release(ctx context.Context) syscall.Errno {
	if !f.vfs.unregister(f) {
		return 0 // closed at unmount already
	}
	if err := f.disk.Close(); err != nil {
		return f.vfs.toErrno(err, "release", f.fields())
	}
	return 0
}

// fsyncFdatasync is FUSE_FSYNC_FDATASYNC in fuse_fsync_in.fsync_flags.
const fsyncFdatasync = 1

// fallocate(2) modes.
const (
	fallocKeepSize  = unix.FALLOC_FL_KEEP_SIZE
	fallocPunchHole = unix.FALLOC_FL_PUNCH_HOLE
	fallocZeroRange = unix.FALLOC_FL_ZERO_RANGE
)

// Allocate maps fallocate(2): mode 0 and KEEP_SIZE allocate zeroed blocks,
// PUNCH_HOLE|KEEP_SIZE punches, ZERO_RANGE (with or without KEEP_SIZE)
// zeroes; anything else is EOPNOTSUPP. Ranges past the end are clipped by
// package image (the probe fallocate(PUNCH_HOLE|KEEP_SIZE, size, 1) of
// cloud-hypervisor succeeds and changes nothing). On a handle opened with
// O_SYNC or O_DSYNC the change is durable before the reply.
func (f *diskFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if off > math.MaxInt64 || size > math.MaxInt64 {
		return syscall.EFBIG
	}
	o, n := int64(off), int64(size)
	var err error
	switch mode {
	case 0:
		err = f.disk.Allocate(o, n, false)
	case fallocKeepSize:
		err = f.disk.Allocate(o, n, true)
	case fallocPunchHole | fallocKeepSize:
		err = f.disk.Punch(o, n)
	case fallocZeroRange:
		err = f.disk.ZeroRange(o, n, false)
	case fallocZeroRange | fallocKeepSize:
		err = f.disk.ZeroRange(o, n, true)
	default:
		return syscall.EOPNOTSUPP
	}
	if err == nil && mode&fallocKeepSize == 0 {
		f.vfs.vhost.resized(f.node.id) // it may have grown the disk
	}
	if err == nil {
		err = f.vfs.makeDurable(f.sync)
	}
	if err != nil {
		return f.vfs.toErrno(err, "fallocate", f.fields("offset", o, "length", n, "mode", mode))
	}
	return 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the disk's map (the kernel
// handles SEEK_SET, SEEK_CUR and SEEK_END itself). Like ext4, an offset at
// or past the end, or negative, is ENXIO.
func (f *diskFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if off > math.MaxInt64 {
		return 0, syscall.ENXIO
	}
	var (
		res int64
		err error
	)
	switch whence {
	case unix.SEEK_DATA:
		res, err = f.disk.SeekData(int64(off))
	case unix.SEEK_HOLE:
		res, err = f.disk.SeekHole(int64(off))
	default:
		return 0, syscall.EINVAL
	}
	if err != nil {
		return 0, f.vfs.toErrno(err, "lseek", f.fields("offset", off, "whence", whence))
	}
	return uint64(res), 0
}
