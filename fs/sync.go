package fs

import (
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
// reply when its flags ask for it: O_DSYNC as fdatasync would make it
// (image.Store.CommitData: data, map and size), O_SYNC as fsync would
// (image.Store.Commit: the times too). fallocate carries no flags, so a
// punch, zero range or allocation is synced by the open flags of its
// handle.
//
// The cost is shared: concurrent synchronous writes wait for the same
// commit, so 32 writers in flight pay for about one flush each round
// (group commit, see image.Store.Commit), not 32 in series.
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

// syncFS makes WRITE requests whose flags ask for O_SYNC or O_DSYNC durable
// before they are answered. It wraps the node file system, under timedFS,
// so the WRITE latency includes the commit; the commit's own wait is the
// SYNC_WRITE operation of the FUSE layer's figures.
type syncFS struct {
	fuse.RawFileSystem
	v     *vfs
	timed *timedFS // set once, before serving
}

// Writev is how go-fuse delivers WRITE first (Write only after ENOSYS).
func (s *syncFS) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	n, st := s.RawFileSystem.Writev(cancel, in, data)
	return s.durable(in, n, st)
}

func (s *syncFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	n, st := s.RawFileSystem.Write(cancel, in, data)
	return s.durable(in, n, st)
}

// durable ends a WRITE that returned n, st: a successful synchronous one is
// answered only once it is durable.
func (s *syncFS) durable(in *fuse.WriteIn, n uint32, st fuse.Status) (uint32, fuse.Status) {
	m := syncModeOf(in.Flags)
	if st != fuse.OK || m == syncNone {
		return n, st
	}
	start := time.Now()
	if err := s.v.makeDurable(m); err != nil {
		// The bytes are on the backing but not promised: the caller
		// must not take the write as done (POSIX: the write fails).
		return 0, fuse.Status(s.v.toErrno(err, "write", logrus.Fields{"ino": in.NodeId,
			"offset": in.Offset, "length": in.Size, "sync": m.String()}))
	}
	s.timed.since("SYNC_WRITE", start)
	return n, st
}
