// Package passthrough is the baseline of the compare tool: a go-fuse file
// system of one regular file whose every read and write goes straight to a
// plain backing file with one pread or pwrite, mounted with the same FUSE
// settings as vdiskfs.
//
// # Why it exists
//
// vdiskfs pays for FUSE and for its block map. To see the second cost alone,
// the compare tool runs the same fio jobs on a vdiskfs disk and on this file
// system: both cross the same kernel FUSE path with the same request sizes,
// queue limits and open flags, so what differs is vdiskfs itself.
//
// # Settings (mirrored from fs/mount.go and fs/vfs.go, not imported)
//
// MaxWrite and MaxReadAhead 1 MiB, MaxBackground 512, CAP_ASYNC_DIO,
// CAP_ATOMIC_O_TRUNC and CAP_DIRECT_IO_ALLOW_MMAP, splice off, locks in the
// kernel, default_permissions, one second attribute and entry timeouts, and
// FOPEN_DIRECT_IO|FOPEN_PARALLEL_DIRECT_WRITES|FOPEN_NOFLUSH on every open
// (vdiskfs uses direct_io for buffered opens too). If fs/mount.go changes
// these, change them here: package fs exports none of them on purpose.
//
// An O_DIRECT open is served from an O_DIRECT descriptor of the backing
// file, like vdiskfs's O_DIRECT backend; a request that O_DIRECT cannot
// take (an unaligned offset, length or buffer) goes through a buffered
// descriptor instead. The kernel FUSE passthrough feature (backing-file
// ids) is deliberately not used: the baseline must cross user space.
//
// # Counting
//
// Every request is counted (Server.Counters): reads and writes with their
// bytes, and the rest by kind, so the compare tool can show the FUSE request
// size the kernel sent. Each read or write is exactly one pread or pwrite on
// the backing file, so these are also the backend I/O counts.
//
// # Concurrency
//
// Requests run in parallel (go-fuse serves each on its own goroutine). The
// handles keep no state beside their descriptors; counters are atomics.
package passthrough

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE settings of vdiskfs: keep equal to fs/mount.go and fs/vfs.go.
const (
	maxWrite          = 1 << 20
	maxBackground     = 512
	attrTimeout       = time.Second
	entryTimeout      = time.Second
	extraCapabilities = fuse.CAP_ASYNC_DIO | fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_DIRECT_IO_ALLOW_MMAP
	openFlags         = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES | fuse.FOPEN_NOFLUSH
	// dioAlign is the alignment an O_DIRECT request needs on the backing
	// file (ext4 on a 512-byte-sector disk needs 512; 4096 is always safe
	// for what we forward).
	dioAlign = 512
)

// Counters is a snapshot of what the file system was asked to do.
type Counters struct {
	Reads, ReadBytes   uint64 // READ requests and bytes returned
	Writes, WriteBytes uint64 // WRITE requests and bytes written
	Direct             uint64 // reads and writes served with O_DIRECT
	Buffered           uint64 // reads and writes that fell back to the buffered descriptor
	Fsyncs             uint64
	Fallocates         uint64
	Setattrs           uint64
	Opens              uint64
	Errors             uint64
}

type counters struct {
	reads, readBytes   atomic.Uint64
	writes, writeBytes atomic.Uint64
	direct, buffered   atomic.Uint64
	fsyncs, fallocates atomic.Uint64
	setattrs, opens    atomic.Uint64
	errors             atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Reads: c.reads.Load(), ReadBytes: c.readBytes.Load(),
		Writes: c.writes.Load(), WriteBytes: c.writeBytes.Load(),
		Direct: c.direct.Load(), Buffered: c.buffered.Load(),
		Fsyncs: c.fsyncs.Load(), Fallocates: c.fallocates.Load(),
		Setattrs: c.setattrs.Load(), Opens: c.opens.Load(),
		Errors: c.errors.Load(),
	}
}

// Options tune Mount.
type Options struct {
	// Name is the file's name in the mount; "" means the backing file's
	// base name.
	Name string
	// Logger receives go-fuse's messages; nil discards them.
	Logger *log.Logger
	// Debug traces every request to Logger.
	Debug bool
}

// Server is a mounted pass-through file system.
type Server struct {
	srv        *fuse.Server
	mountpoint string
	file       string
	cnt        *counters
	done       chan struct{}
}

// Mount serves backing (a regular file) as the one file of a new file
// system at mountpoint and returns once the kernel has the mount.
func Mount(backing, mountpoint string, opts Options) (*Server, error) {
	st, err := os.Stat(backing)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("passthrough: %s is not a regular file", backing)
	}
	name := opts.Name
	if name == "" {
		name = st.Name()
	}
	cnt := &counters{}
	file := &fileNode{backing: backing, cnt: cnt}
	root := &rootNode{name: name, file: file}
	lg := opts.Logger
	if lg == nil {
		lg = log.New(io.Discard, "", 0)
	}
	at, et := attrTimeout, entryTimeout
	fo := &gofs.Options{
		MountOptions: fuse.MountOptions{
			Options:           []string{"default_permissions"},
			MaxBackground:     maxBackground,
			MaxWrite:          maxWrite,
			MaxReadAhead:      maxWrite,
			FsName:            "passthrough",
			Name:              "passthrough",
			DirectMount:       true,
			EnableLocks:       false,
			ExtraCapabilities: extraCapabilities,
			DisableXAttrs:     true,
			DisableSplice:     true,
			Debug:             opts.Debug,
			Logger:            lg,
		},
		EntryTimeout:   &et,
		AttrTimeout:    &at,
		RootStableAttr: &gofs.StableAttr{Ino: fuse.FUSE_ROOT_ID},
		Logger:         lg,
	}
	srv, err := fuse.NewServer(gofs.NewNodeFS(root, fo), mountpoint, &fo.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("passthrough: mount %s: %w", mountpoint, err)
	}
	s := &Server{srv: srv, mountpoint: mountpoint, file: name, cnt: cnt, done: make(chan struct{})}
	go func() {
		srv.Serve()
		close(s.done)
	}()
	if err := srv.WaitMount(); err != nil {
		_ = s.Unmount()
		return nil, fmt.Errorf("passthrough: mount %s: %w", mountpoint, err)
	}
	return s, nil
}

// Path is the path of the served file inside the mount.
func (s *Server) Path() string { return s.mountpoint + "/" + s.file }

// Counters returns a snapshot of the request counters.
func (s *Server) Counters() Counters { return s.cnt.snapshot() }

// Unmount unmounts (lazily if the mount stays busy) and waits for serving
// to end.
func (s *Server) Unmount() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	var err error
	for try := 0; try < 3; try++ {
		if err = s.srv.Unmount(); err == nil {
			break
		}
	}
	if err != nil {
		if lerr := unix.Unmount(s.mountpoint, unix.MNT_DETACH); lerr != nil {
			return fmt.Errorf("passthrough: unmount %s: %w", s.mountpoint, errors.Join(err, lerr))
		}
	}
	<-s.done
	return nil
}

// rootNode is the directory holding the one file.
type rootNode struct {
	gofs.Inode
	name string
	file *fileNode
}

var (
	_ = (gofs.NodeOnAdder)((*rootNode)(nil))
	_ = (gofs.NodeGetattrer)((*rootNode)(nil))
	_ = (gofs.NodeStatfser)((*rootNode)(nil))
)

func (r *rootNode) OnAdd(ctx context.Context) {
	ch := r.NewPersistentInode(ctx, r.file, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
	r.AddChild(r.name, ch, false)
}

func (r *rootNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	out.Ino = fuse.FUSE_ROOT_ID
	return 0
}

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return r.file.Statfs(ctx, out)
}

// fileNode is the served file; its attributes are the backing file's.
type fileNode struct {
	gofs.Inode
	backing string
	cnt     *counters
}

var (
	_ = (gofs.NodeGetattrer)((*fileNode)(nil))
	_ = (gofs.NodeSetattrer)((*fileNode)(nil))
	_ = (gofs.NodeOpener)((*fileNode)(nil))
	_ = (gofs.NodeStatfser)((*fileNode)(nil))
)

func (n *fileNode) fillAttr(st *syscall.Stat_t, a *fuse.Attr) {
	a.FromStat(st)
	a.Ino = 2
	a.Blksize = maxWrite // as vdiskfs: the preferred I/O size is 1 MiB
}

func (n *fileNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Stat(n.backing, &st); err != nil {
		n.cnt.errors.Add(1)
		return gofs.ToErrno(err)
	}
	n.fillAttr(&st, &out.Attr)
	return 0
}

func (n *fileNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.cnt.setattrs.Add(1)
	if size, ok := in.GetSize(); ok {
		if err := syscall.Truncate(n.backing, int64(size)); err != nil {
			n.cnt.errors.Add(1)
			return gofs.ToErrno(err)
		}
	}
	if mode, ok := in.GetMode(); ok {
		if err := syscall.Chmod(n.backing, mode); err != nil {
			return gofs.ToErrno(err)
		}
	}
	return n.Getattr(ctx, f, out)
}

func (n *fileNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st syscall.Statfs_t
	if err := syscall.Statfs(n.backing, &st); err != nil {
		return gofs.ToErrno(err)
	}
	out.FromStatfsT(&st)
	return 0
}

// Open opens the backing file: with O_DIRECT when the client asked for it,
// plus a buffered descriptor for requests O_DIRECT cannot take. O_TRUNC
// truncates (the mount asks for atomic O_TRUNC, like vdiskfs).
func (n *fileNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	n.cnt.opens.Add(1)
	acc := int(flags) & syscall.O_ACCMODE
	base := acc | syscall.O_CLOEXEC
	if flags&syscall.O_TRUNC != 0 {
		base |= syscall.O_TRUNC
	}
	buffered, err := syscall.Open(n.backing, base, 0)
	if err != nil {
		n.cnt.errors.Add(1)
		return nil, 0, gofs.ToErrno(err)
	}
	h := &handle{cnt: n.cnt, buffered: buffered, direct: -1}
	if flags&syscall.O_DIRECT != 0 {
		d, err := syscall.Open(n.backing, acc|syscall.O_CLOEXEC|syscall.O_DIRECT, 0)
		if err != nil {
			syscall.Close(buffered)
			n.cnt.errors.Add(1)
			return nil, 0, gofs.ToErrno(err)
		}
		h.direct = d
	}
	return h, openFlags, 0
}

// handle is an open file: the descriptors of the backing file.
type handle struct {
	cnt      *counters
	buffered int // always open
	direct   int // -1 unless the client opened O_DIRECT
}

var (
	_ = (gofs.FileReader)((*handle)(nil))
	_ = (gofs.FileWriter)((*handle)(nil))
	_ = (gofs.FileFsyncer)((*handle)(nil))
	_ = (gofs.FileFlusher)((*handle)(nil))
	_ = (gofs.FileReleaser)((*handle)(nil))
	_ = (gofs.FileAllocater)((*handle)(nil))
	_ = (gofs.FileLseeker)((*handle)(nil))
	_ = (gofs.FileGetattrer)((*handle)(nil))
)

// fdFor picks the O_DIRECT descriptor when the request can use it.
func (h *handle) fdFor(p []byte, off int64) int {
	if h.direct >= 0 && off%dioAlign == 0 && len(p)%dioAlign == 0 && len(p) > 0 &&
		uintptr(unsafe.Pointer(&p[0]))%dioAlign == 0 {
		h.cnt.direct.Add(1)
		return h.direct
	}
	if h.direct >= 0 {
		h.cnt.buffered.Add(1)
	}
	return h.buffered
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.cnt.reads.Add(1)
	fd := h.fdFor(dest, off)
	n, err := syscall.Pread(fd, dest, off)
	if err == syscall.EINVAL && fd != h.buffered {
		n, err = syscall.Pread(h.buffered, dest, off)
	}
	if err != nil {
		h.cnt.errors.Add(1)
		return nil, gofs.ToErrno(err)
	}
	h.cnt.readBytes.Add(uint64(n))
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.cnt.writes.Add(1)
	fd := h.fdFor(data, off)
	n, err := syscall.Pwrite(fd, data, off)
	if err == syscall.EINVAL && fd != h.buffered {
		n, err = syscall.Pwrite(h.buffered, data, off)
	}
	if err != nil {
		h.cnt.errors.Add(1)
		return 0, gofs.ToErrno(err)
	}
	h.cnt.writeBytes.Add(uint64(n))
	return uint32(n), 0
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.cnt.fsyncs.Add(1)
	return gofs.ToErrno(syscall.Fsync(h.buffered))
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	err := syscall.Close(h.buffered)
	if h.direct >= 0 {
		err = errors.Join(err, syscall.Close(h.direct))
	}
	if err != nil {
		return syscall.EIO
	}
	return 0
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	h.cnt.fallocates.Add(1)
	return gofs.ToErrno(unix.Fallocate(h.buffered, mode, int64(off), int64(size)))
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	n, err := unix.Seek(h.buffered, int64(off), int(whence))
	return uint64(n), gofs.ToErrno(err)
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(h.buffered, &st); err != nil {
		return gofs.ToErrno(err)
	}
	out.FromStat(&st)
	out.Ino = 2
	out.Blksize = maxWrite
	return 0
}
