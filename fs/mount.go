package fs

import (
	"errors"
	"fmt"
	"io"
	"log"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/fs/fuseuring"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// Settings of the mount; doc.go says why each has its value.
const (
	// maxWrite is the largest READ or WRITE request (FUSE's ceiling, 256
	// pages): one request, one backend run.
	maxWrite = 1 << 20
	// defaultMaxBackground covers four disks at iodepth 128 of async
	// direct I/O (docs/CLIENTS.md trap 3).
	defaultMaxBackground = 512
	// attrTimeout and entryTimeout: every size and name change goes
	// through this mount, so the kernel's copies stay right; the timeouts
	// only bound how stale a change made behind the mount (through the
	// Store in the same process) can look, see Server.InvalidateDisk.
	attrTimeout  = time.Second
	entryTimeout = time.Second
	// minBlksize is the least st_blksize of a disk: the preferred I/O
	// size, which cp and dd use as their buffer size.
	minBlksize = maxWrite
	// capabilities asked of the kernel on top of go-fuse's defaults.
	extraCapabilities = fuse.CAP_ASYNC_DIO | fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_DIRECT_IO_ALLOW_MMAP
	// unmountTries is how often Unmount retries a busy unmount (each try
	// is go-fuse's own five attempts) before it detaches lazily.
	unmountTries = 3
)

// Options tune Mount.
type Options struct {
	// AllowOther lets users other than the mounter use the mount
	// (allow_other); permissions are still enforced (default_permissions).
	AllowOther bool
	// Debug traces every FUSE request to Logger at info level.
	Debug bool
	// Logger receives structured logs; nil means logrus.StandardLogger().
	Logger logrus.FieldLogger
	// MaxBackground bounds the kernel's background requests (async direct
	// I/O and readahead); 0 means 512, several disks at iodepth 128.
	MaxBackground int
	// FsName is shown as the source in /proc/mounts; "" means "vdiskfs".
	FsName string

	// Transport picks io_uring or /dev/fuse; "" (auto) uses io_uring when
	// the kernel offers it. Mount only looks: PrepareTransport, called
	// first, turns the fuse module's enable_uring on where it may.
	Transport Transport

	// VhostServe serves a disk on the vhost-user door (vhost.go); nil
	// is the real device (tests put a fake in its place). VhostUserDir, when not "", is a directory in
	// which every disk is served as NAME.sock; VhostUserQueues is the
	// most queues a device offers (0: one per CPU); VhostUserGroup, when
	// not nil, is the gid the sockets are given (0660; else 0600).
	VhostServe      VhostServe
	VhostUserDir    string
	VhostUserQueues int
	VhostUserGroup  *int

	// pageCache makes buffered (non-O_DIRECT) opens use the kernel page
	// cache instead of direct_io. For the benchmark that chose direct_io
	// (BenchmarkBufferedOpen; docs/BENCHMARKS.md, "Buffered opens").
	pageCache bool
}

// Server is a mounted store.
type Server struct {
	srv        *fuse.Server
	timed      *timedFS
	vfs        *vfs
	root       *rootNode
	mountpoint string
	log        logrus.FieldLogger
	done       chan struct{}        // closed when serving has ended
	transport  string               // "io_uring" or "dev", as serving
	ring       *fuseuring.Transport // nil on /dev/fuse; set before Mount returns
	unmountMu  sync.Mutex           // serialises Unmount calls
}

// Mount serves store at mountpoint and returns once the kernel has the mount.
// The store stays the caller's: Unmount does not close it.
func Mount(store *image.Store, mountpoint string, opts Options) (*Server, error) {
	lg := opts.Logger
	if lg == nil {
		lg = logrus.StandardLogger()
	}
	lg = lg.WithField("mountpoint", mountpoint)
	v := newVFS(store, lg, opts)
	root := &rootNode{vfs: v}

	maxBG := opts.MaxBackground
	if maxBG <= 0 {
		maxBG = defaultMaxBackground
	}
	fsName := opts.FsName
	if fsName == "" {
		fsName = "vdiskfs"
	}
	traceLevel := logrus.WarnLevel
	if opts.Debug {
		traceLevel = logrus.InfoLevel
	}
	caps := uint64(extraCapabilities)
	useRing, noRing := wantIOURing(opts.Transport)
	if useRing {
		caps |= fuse.CAP_OVER_IO_URING
	}
	at, et := attrTimeout, entryTimeout
	fo := &gofs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:        opts.AllowOther,
			Options:           []string{"default_permissions"},
			MaxBackground:     maxBG,
			MaxWrite:          maxWrite,
			MaxReadAhead:      maxWrite, // no cap of ours: the kernel's own limit applies
			FsName:            fsName,
			Name:              "vdiskfs",
			DirectMount:       true, // falls back to fusermount when mount(2) is refused
			EnableLocks:       false,
			ExtraCapabilities: caps,
			DisableXAttrs:     true,
			// Read replies are memory we filled, written with writev;
			// splice only helps fd-backed replies, and fails (with a log
			// line each time) for 1 MiB ones, above the pipe size limit.
			DisableSplice: true,
			Debug:         opts.Debug,
			Logger:        log.New(logWriter{lg.WithField("component", "go-fuse"), traceLevel}, "", 0),
		},
		EntryTimeout:    &et,
		AttrTimeout:     &at,
		NullPermissions: true, // mode 0000 is a mode, not "unset"
		RootStableAttr:  &gofs.StableAttr{Ino: fuse.FUSE_ROOT_ID},
		// Node ids are inode numbers (a disk's store id, never reused), so
		// that the io_uring queues can tell a request's disk (ownerIO).
		ExternalNodeID: true,
		Logger:         log.New(logWriter{lg.WithField("component", "go-fuse"), logrus.WarnLevel}, "", 0),
	}
	sfs := &syncFS{RawFileSystem: gofs.NewNodeFS(root, fo), v: v}
	timed := newTimedFS(sfs)
	sfs.timed = timed
	srv, err := fuse.NewServer(timed, mountpoint, &fo.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	s := &Server{srv: srv, timed: timed, vfs: v, root: root, mountpoint: mountpoint, log: lg,
		done: make(chan struct{}), transport: string(TransportDev)}
	// Serve /dev/fuse first: the io_uring queues take over only once all
	// are registered, and FORGET, INTERRUPT and notifications stay there.
	ringc := make(chan *fuseuring.Transport, 1)
	go func() {
		srv.Serve()
		if ring := <-ringc; ring != nil {
			ring.Close()
		}
		v.vhost.closeAll()
		v.closeAll()
		close(s.done)
	}()
	var ring *fuseuring.Transport
	if useRing {
		ring, noRing = startIOURing(srv, timed, &fo.MountOptions, fuseuring.Options{MaxWrite: maxWrite, Logger: lg,
			IO: ownerIO{v: v, timed: timed}})
		if noRing == nil {
			s.transport, s.ring = string(TransportIOURing), ring
		}
	}
	ringc <- ring
	if noRing != nil && opts.Transport == TransportIOURing {
		_ = s.Unmount()
		return nil, fmt.Errorf("mount %s: FUSE-over-io_uring: %w", mountpoint, noRing)
	}
	if err := srv.WaitMount(); err != nil {
		_ = s.Unmount()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	fields := logrus.Fields{"max_write": maxWrite, "max_background": maxBG, "fuse_transport": s.transport}
	if noRing != nil {
		fields["fuse_transport_reason"] = noRing.Error()
	}
	lg.WithFields(fields).Info("mounted")
	if err := v.vhost.serveAll(); err != nil {
		_ = s.Unmount()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	return s, nil
}

// Transport is how the mount's requests travel: "io_uring" or "dev".
func (s *Server) Transport() string { return s.transport }

// Mountpoint returns the directory the store is mounted on.
func (s *Server) Mountpoint() string { return s.mountpoint }

// Wait blocks until the mount is gone (Unmount, fusermount -u, umount) and
// serving has ended.
func (s *Server) Wait() { <-s.done }

// Unmount unmounts and waits for serving to end. A busy mount is retried a
// few times and then detached lazily (MNT_DETACH): the name goes at once,
// and Unmount returns when the last open file on it is closed. It does not
// close the store.
func (s *Server) Unmount() error {
	s.unmountMu.Lock()
	defer s.unmountMu.Unlock()
	select {
	case <-s.done:
		return nil
	default:
	}
	var err error
	for try := 0; try < unmountTries; try++ {
		if err = s.srv.Unmount(); err == nil {
			break
		}
		select {
		case <-s.done: // unmounted meanwhile by someone else
			return nil
		default:
		}
	}
	if err != nil {
		s.log.WithError(err).Warn("mount busy; detaching it lazily, serving goes on until the last open file is closed")
		if lerr := lazyUnmount(s.mountpoint); lerr != nil {
			return fmt.Errorf("unmount %s: %w", s.mountpoint, errors.Join(err, lerr))
		}
	}
	<-s.done
	s.log.Info("unmounted")
	return nil
}

// lazyUnmount detaches the mount (umount -l), with fusermount -u -z when
// we may not call umount2 ourselves.
func lazyUnmount(mountpoint string) error {
	err := unix.Unmount(mountpoint, unix.MNT_DETACH)
	if err == nil || !errors.Is(err, syscall.EPERM) {
		return err
	}
	for _, bin := range []string{"fusermount3", "fusermount"} {
		if path, lerr := exec.LookPath(bin); lerr == nil {
			out, cerr := exec.Command(path, "-u", "-z", mountpoint).CombinedOutput()
			if cerr != nil {
				return fmt.Errorf("%s -u -z: %w: %s", bin, cerr, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	return err
}

// InvalidateDisk makes the kernel forget what it caches about the disk
// called name (attributes, above all its size, and any cached pages) and
// the name itself. Changes made through the mount need no such call; it is
// for an in-process caller that resizes or renames a disk through the Store
// directly while the store is mounted (docs/CLIENTS.md trap 10: the kernel
// answers O_DIRECT reads past the size it caches with EOF).
func (s *Server) InvalidateDisk(name string) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	// The kernel holds an entry for name only while it holds the node
	// (the mount caches no negative entries): with none, there is nothing
	// to forget. Skipping the notification then matters beyond its cost:
	// NOTIFY_INVAL_ENTRY waits for the directory's lock, which a create or
	// lookup in flight holds until we answer it, so a daemon killed while
	// one waited could never exit (its thread stuck in the kernel) and
	// kept the mount hung; a new snapshot's or clone's name is the usual
	// case.
	ch := s.root.GetChild(name)
	if ch == nil {
		return nil
	}
	if e := ch.NotifyContent(0, 0); e != 0 && e != syscall.ENOENT {
		return fmt.Errorf("invalidate disk %q: %w", name, e)
	}
	if e := s.root.NotifyEntry(name); e != 0 && e != syscall.ENOENT {
		return fmt.Errorf("invalidate entry %q: %w", name, e)
	}
	return nil
}

// Snapshot takes a snapshot called name of the disk src of the mounted
// store (image.Store.Snapshot: a read-only disk sharing every block of src,
// holding every write to src acknowledged before the call, committed when
// it returns) and shows it in the mount at once. Lookup and Readdir ask the
// catalog on every call and the mount caches no negative entries, so the
// new name is found anyway; the kernel is still told to forget any entry
// it holds under name, in case it has one from a lookup that raced with
// the snapshot.
//
// Writes through shared mmap of src that the kernel has not written back
// yet are not in the snapshot (every other write reaches the store before
// it is acknowledged): like a snapshot of a disk, it is crash-consistent.
func (s *Server) Snapshot(src, name string) (image.DiskInfo, error) {
	return s.showNew("snapshot", name)(s.vfs.store.Snapshot(src, name))
}

// Clone makes name, a writable disk sharing every block of the disk src
// (image.Store.Clone, taken in one step as a snapshot is), and shows it in
// the mount at once, as Snapshot does.
func (s *Server) Clone(src, name string) (image.DiskInfo, error) {
	return s.showNew("clone", name)(s.vfs.store.Clone(src, name))
}

// showNew returns what tells the kernel of name, a disk just made, once
// the call that made it succeeded.
func (s *Server) showNew(what, name string) func(image.DiskInfo, error) (image.DiskInfo, error) {
	return func(info image.DiskInfo, err error) (image.DiskInfo, error) {
		if err != nil {
			return image.DiskInfo{}, err
		}
		if err := s.InvalidateDisk(name); err != nil {
			s.log.WithError(err).WithField("disk", name).Warn(what + " made, but the kernel was not told of its name; it shows once the entry times out")
		}
		s.vfs.vhost.created(name)
		return info, nil
	}
}

// Diff lists where the disk new differs from the disk old (image.Diff),
// for `vdisk diff` on a mounted store.
func (s *Server) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
	store := s.vfs.store
	od, err := store.OpenDisk(old)
	if err != nil {
		return nil, image.DiffStats{}, err
	}
	defer od.Close()
	nd, err := store.OpenDisk(new)
	if err != nil {
		return nil, image.DiffStats{}, err
	}
	defer nd.Close()
	return image.Diff(od, nd)
}

// Send writes the stream of a disk (transfer.Send), for `vdisk send` on a
// mounted store: a disk that is not a snapshot may be written meanwhile,
// so it is sent from a hidden snapshot (transfer.SendOptions.Live).
func (s *Server) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	return transfer.Send(w, s.vfs.store, disk, transfer.SendOptions{From: from, Live: true})
}

// Receive makes the disk name from a stream (transfer.Receive), for
// `vdisk receive` on a mounted store; the kernel is told of the new name.
func (s *Server) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	st, err := transfer.Receive(r, s.vfs.store, name, o)
	if err != nil {
		return st, err
	}
	if err := s.InvalidateDisk(name); err != nil {
		s.log.WithError(err).WithField("disk", name).Warn("disk received, but the kernel was not told of its name; it shows once the entry times out")
	}
	s.vfs.vhost.created(name)
	return st, nil
}

// logWriter turns go-fuse's *log.Logger lines into logrus entries.
type logWriter struct {
	log   logrus.FieldLogger
	level logrus.Level
}

func (w logWriter) Write(p []byte) (int, error) {
	msg := strings.TrimRight(string(p), "\n")
	switch w.level {
	case logrus.InfoLevel:
		w.log.Info(msg)
	case logrus.DebugLevel:
		w.log.Debug(msg)
	default:
		w.log.Warn(msg)
	}
	return len(p), nil
}
