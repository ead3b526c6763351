package fs

import (
	"context"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/image"
)

// vfs is the state every node of one mount shares.
type vfs struct {
	store   *image.Store
	log     logrus.FieldLogger
	blksize uint32 // st_blksize of a disk
	// The FOPEN_* flags for O_DIRECT and for buffered opens.
	directFlags, bufferedFlags uint32
	// The root directory's attributes: owned by the mounter, created at
	// mount time.
	uid, gid uint32
	mounted  time.Time
	vhost    *vhostSet // the disks served on vhost-user (vhost.go)

	mu struct {
		sync.Mutex
		// files are the open handles by inode number, which is the FUSE
		// node id (ExternalNodeID): so that a node can find one for a
		// request the kernel sends without a handle, so that the requests
		// the io_uring queues serve themselves find one (ownerIO), and so
		// that handles still open when serving ends are closed.
		files  map[uint64][]*diskFile
		closed bool // serving ended; no handle is registered any more
	}
	// unpinned is signalled, with mu, when a file's last pin goes and its
	// Release waits for that.
	unpinned *sync.Cond
}

// Open flags: see doc.go, "Settings" and "Buffered opens".
const (
	// FOPEN_PARALLEL_DIRECT_WRITES is 1<<6 in go-fuse v2.12.1 and in the
	// kernel's include/uapi/linux/fuse.h (since 6.2).
	directOpenFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES | fuse.FOPEN_NOFLUSH
	// Buffered opens use direct_io too, measured against the page cache
	// (BenchmarkBufferedOpen): faster for the large sequential I/O of cp,
	// dd and qemu-img, coherent with the hypervisor's O_DIRECT open and
	// with punch and truncate, and parallel for qemu-img convert's writers
	// (the page-cache write path holds the inode lock).
	bufferedOpenFlags = directOpenFlags
	// pageCacheOpenFlags is the alternative measured (Options.pageCache).
	pageCacheOpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
)

func newVFS(store *image.Store, lg logrus.FieldLogger, opts Options) *vfs {
	v := &vfs{
		store:         store,
		log:           lg,
		blksize:       uint32(max(minBlksize, store.BlockSize())),
		directFlags:   directOpenFlags,
		bufferedFlags: bufferedOpenFlags,
		uid:           uint32(os.Geteuid()),
		gid:           uint32(os.Getegid()),
		mounted:       time.Now(),
		vhost:         newVhostSet(store, lg, opts),
	}
	if opts.pageCache {
		v.bufferedFlags = pageCacheOpenFlags
	}
	v.mu.files = make(map[uint64][]*diskFile)
	v.unpinned = sync.NewCond(&v.mu)
	return v
}

// register records an open handle; false once serving has ended.
func (v *vfs) register(f *diskFile) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mu.closed {
		return false
	}
	ino := inoOf(f.node.id)
	v.mu.files[ino] = append(v.mu.files[ino], f)
	return true
}

// unregister forgets an open handle, and waits until no owner request
// (ownerIO) or withOpenHandle has it pinned, so that the caller may close
// it; false if it was not registered (it was closed by closeAll already).
func (v *vfs) unregister(f *diskFile) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	ino := inoOf(f.node.id)
	open := v.mu.files[ino]
	i := slices.Index(open, f)
	if i < 0 {
		return false
	}
	if open = slices.Delete(open, i, i+1); len(open) == 0 {
		delete(v.mu.files, ino)
	} else {
		v.mu.files[ino] = open
	}
	for f.pins > 0 {
		v.unpinned.Wait()
	}
	return true
}

// pin returns an open handle of the disk whose inode number is ino, kept
// open until unpin; nil if it has none.
func (v *vfs) pin(ino uint64) *diskFile {
	v.mu.Lock()
	defer v.mu.Unlock()
	open := v.mu.files[ino]
	if len(open) == 0 {
		return nil
	}
	f := open[0]
	f.pins++
	return f
}

func (v *vfs) unpin(f *diskFile) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if f.pins--; f.pins == 0 {
		v.unpinned.Broadcast()
	}
}

// withOpenHandle runs fn on a handle of an open file of n's disk, if there
// is one; the handle stays open (pinned, as for ownerIO) while fn runs. For
// requests that come without a file handle on a disk that has lost its
// name (unlinked while open). fn runs without v.mu: a truncate waits for
// the ranges of requests in flight, and a queue thread that must finish
// one of them may be waiting for v.mu in pin.
func (v *vfs) withOpenHandle(n *diskNode, fn func(*image.Disk) error) (bool, error) {
	f := v.pin(inoOf(n.id))
	if f == nil {
		return false, nil
	}
	defer v.unpin(f)
	return true, fn(f.disk)
}

// closeAll closes the handles the kernel did not release before the mount
// went away (RELEASE is asynchronous and may be lost at unmount), so that
// disks unlinked while open are freed now and not at the next open.
func (v *vfs) closeAll() {
	v.mu.Lock()
	files := v.mu.files
	v.mu.files = nil
	v.mu.closed = true
	v.mu.Unlock()
	n := 0
	for _, open := range files {
		for _, f := range open {
			if err := f.disk.Close(); err != nil {
				v.log.WithError(err).WithField("disk_id", f.node.id).Warn("closing a disk left open at unmount")
			}
			n++
		}
	}
	if n > 0 {
		v.log.WithField("handles", n).Info("closed disk handles left open at unmount")
	}
}

// statfs answers statfs(2) for any node: the whole store.
func (v *vfs) statfs(out *fuse.StatfsOut) syscall.Errno {
	info := v.store.Info()
	bs := uint64(info.BlockSize)
	out.Bsize = uint32(bs)
	out.Frsize = uint32(bs)
	out.Blocks = uint64(info.CapacityBytes) / bs
	// Never more free than there is: image.Store.Info counts blocks
	// waiting for a commit to be released as free even when another disk
	// still maps them (a removed clone's shared blocks, until the next
	// commit), which made df show a negative use.
	out.Bfree = min(uint64(info.FreeBytes)/bs, out.Blocks)
	out.Bavail = out.Bfree
	// There is no table of inodes to run out of: a new disk costs a
	// catalog record, so the free blocks bound how many more there can be.
	out.Ffree = out.Bfree
	out.Files = uint64(info.Disks) + out.Ffree
	out.NameLen = image.MaxNameLen
	return 0
}

// inoOf is a disk's inode number: its store id, which never changes and
// is never reused, moved past the root's inode number 1.
func inoOf(id uint64) uint64 { return id + 1 }

// fillAttr describes a disk as a regular file.
func (v *vfs) fillAttr(a *fuse.Attr, info image.DiskInfo) {
	a.Ino = inoOf(info.ID)
	a.Size = uint64(info.Size)
	a.Blocks = uint64(info.Allocated) / 512
	a.Blksize = v.blksize
	a.Mode = syscall.S_IFREG | info.Mode&07777
	a.Nlink = 1
	a.Uid = info.UID
	a.Gid = info.GID
	a.SetTimes(&info.Atime, &info.Mtime, &info.Ctime)
}

// caller returns who sent the request (for the owner of a new disk).
func caller(ctx context.Context) (uid, gid uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return uint32(os.Geteuid()), uint32(os.Getegid())
}
