package fs

import (
	"math"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Synchronous writes (O_SYNC, O_DSYNC, RWF_SYNC, RWF_DSYNC).
//
// Every open of a disk is FOPEN_DIRECT_IO, and on such a file the kernel
// does not sync after a write the way generic_write_sync does for cached
// files: a write on an O_DSYNC descriptor reaches us as a plain WRITE, and
// would be acknowledged with its mapping still in memory. What the kernel
// does give us is the flags: fuse_write_in.flags is the file's f_flags,
// with O_DSYNC added for a per-call RWF_DSYNC and O_SYNC for RWF_SYNC
// (fuse_write_flags in fs/fuse/file.c). So a WRITE is durable before its
// reply when its flags ask for it (image.Disk.WriteAtSync): with O_DSYNC
// the data and what is needed to read it back (map, size), with O_SYNC the
// times too. fallocate carries no flags, so a punch, zero range or
// allocation is committed by the open flags of its handle
// (image.Store.CommitData, Commit).
//
// The cost stays small and shared: an O_DSYNC overwrite in place of blocks
// whose mappings are durable is a durable (FUA) write of its own and waits
// for nothing else; any other synchronous write waits for a commit that
// concurrent ones share (group commit, see image.Store.Commit), so 32
// writers in flight pay for about one flush each round, not 32 in series.
//
// The io_uring queue threads do not serve synchronous writes themselves
// (ownerRequest.Start declines them): waiting for a commit would stall
// every request of their queue. A worker serves them through syncFS.
//
// sync(2) and syncfs(2) never reach a FUSE server other than virtiofs (the
// kernel sends FUSE_SYNCFS only there), and with FOPEN_DIRECT_IO there is
// no dirty page cache for them to write back: they make nothing of a
// vdiskfs mount durable. `vdisk sync MOUNTPOINT` commits the whole store.

// syncMode is what a write or fallocate must make durable before its reply.
type syncMode uint8

const (
	syncNone syncMode = iota
	syncData          // O_DSYNC: data and the metadata needed to read it
	syncAll           // O_SYNC: everything, times included
)

// syncModeOf reads the open flags of a request (O_SYNC is __O_SYNC|O_DSYNC).
func syncModeOf(flags uint32) syncMode {
	switch {
	case flags&unix.O_SYNC == unix.O_SYNC:
		return syncAll
	case flags&unix.O_DSYNC != 0:
		return syncData
	}
	return syncNone
}

func (m syncMode) String() string {
	return [...]string{"none", "dsync", "sync"}[m]
}

// makeDurable commits the store as m asks.
func (v *vfs) makeDurable(m syncMode) error {
	switch m {
	case syncData:
		return v.store.CommitData()
	case syncAll:
		return v.store.Commit()
	}
	return nil
}

// syncFS serves WRITE requests whose flags ask for O_SYNC or O_DSYNC with
// image.Disk.WriteAtSync, which returns once the write is durable, so the
// reply promises it. Other requests pass through. It wraps the node file
// system, under timedFS, so the WRITE latency includes the commit; the
// synchronous writes alone are the SYNC_WRITE operation of the FUSE
// layer's figures.
//
// Like the io_uring queues' own requests (ownerIO), a synchronous write
// uses any open handle of the disk, pinned while it runs: every handle of
// a disk writes the same disk.
type syncFS struct {
	fuse.RawFileSystem
	v     *vfs
	timed *timedFS // set once, before serving
}

// Writev is how go-fuse delivers WRITE first (Write only after ENOSYS).
func (s *syncFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if m := syncModeOf(in.Flags); m != syncNone && len(data) == 1 {
		return s.writeSync(cancel, in, data[0], m)
	}
	n, st := s.RawFileSystem.Writev(cancel, in, data)
	return s.durable(in, n, st)
}

func (s *syncFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if m := syncModeOf(in.Flags); m != syncNone {
		return s.writeSync(cancel, in, data, m)
	}
	return s.RawFileSystem.Write(cancel, in, data)
}

// writeSync serves a synchronous WRITE.
func (s *syncFS) writeSync(cancel <-chan struct{}, in *fuse.WriteIn, data []byte, m syncMode) (uint32, fuse.Status) {
	defer s.timed.since("SYNC_WRITE", time.Now())
	f := s.v.pin(in.NodeId)
	if f == nil || in.Offset > math.MaxInt64 {
		// No handle we know of (cannot happen for a WRITE, which comes
		// on an open file): the node file system's write, then a commit.
		if f != nil {
			s.v.unpin(f)
		}
		n, st := s.RawFileSystem.Write(cancel, in, data)
		return s.durable(in, n, st)
	}
	defer s.v.unpin(f)
	n, err := f.disk.WriteAtSync(data, int64(in.Offset), m == syncAll)
	if err != nil {
		return 0, fuse.Status(s.v.toErrno(err, "write", f.fields("offset", in.Offset, "length", len(data), "sync", m.String())))
	}
	return uint32(n), fuse.OK
}

// durable ends a write that the node file system served and that returned
// n, st: a successful synchronous one is answered only once the store is
// committed.
func (s *syncFS) durable(in *fuse.WriteIn, n uint32, st fuse.Status) (uint32, fuse.Status) {
	m := syncModeOf(in.Flags)
	if st != fuse.OK || m == syncNone {
		return n, st
	}
	if err := s.v.makeDurable(m); err != nil {
		// The bytes are on the backing but not promised: the caller
		// must not take the write as done (POSIX: the write fails).
		return 0, fuse.Status(s.v.toErrno(err, "write", logrus.Fields{"ino": in.NodeId,
			"offset": in.Offset, "length": in.Size, "sync": m.String()}))
	}
	return n, st
}
