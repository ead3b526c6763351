// Package fs serves a vdiskfs store as a FUSE filesystem (go-fuse v2): one
// directory, the mount's root, whose entries are the store's disks, each a
// regular file that a hypervisor opens as a raw image.
//
// # What it is
//
// The package maps FUSE requests to package image and image errors to
// errno, and holds no policy: what a write allocates, what a punch frees,
// when anything is durable, is decided in image. Mount serves a store;
// Unmount and Wait end it. The CLI's "vdisk mount" is the caller.
//
//	root directory   Lookup, Readdir, Create, Mknod (S_IFREG), Unlink, Rename,
//	                 Statfs; Mkdir, Symlink, Link, Mknod of other types: EPERM;
//	                 O_TMPFILE: EOPNOTSUPP; Rmdir: ENOTDIR or ENOENT
//	disk (diskNode)  Getattr, Setattr (size → Disk.Truncate; mode, owner,
//	                 times → Disk.SetAttr), Open, Statfs, CopyFileRange
//	open file        Read, Write (O_SYNC, O_DSYNC → Disk.WriteAtSync: sync.go),
//	                 Fsync (fsync → Disk.Sync, fdatasync → Disk.SyncData),
//	(diskFile)       Flush (nothing), Release (Disk.Close), Allocate
//	                 (fallocate), Lseek (SEEK_DATA, SEEK_HOLE)
//
// Beside the files, a mount may serve disks as vhost-user-blk devices
// (Options.VhostServe, Server.ServeVhostUser, Options.VhostUserDir):
// vhost.go says when servers start, move and stop.
//
// A disk's inode number is its store id + 1 (ids never change and are
// never reused; 1 is the root). Its mode is S_IFREG with the permission
// bits of the catalog, nlink 1, st_blocks the allocated bytes / 512 (du is
// honest: go-fuse would make st_blocks up from the size if st_blksize were
// left 0), st_blksize 1 MiB (see below).
//
// # Settings, and why (docs/CLIENTS.md traps)
//
//   - Never ENOSYS for FSYNC, FALLOCATE, LSEEK or COPY_FILE_RANGE (trap 1):
//     the kernel remembers ENOSYS for the whole mount. Fsync is Disk.Sync
//     (data and map durable; fdatasync leaves the times to the next
//     commit); unsupported fallocate modes answer
//     EOPNOTSUPP. COPY_FILE_RANGE is served (see "Clones and snapshots");
//     ENOSYS to it would set no_copy_file_range for the mount.
//
//   - EnableLocks false (trap 2): flock, POSIX and OFD locks stay in the
//     kernel, so the hypervisors' F_OFD_SETLK gets 0 or EAGAIN.
//
//   - CAP_ASYNC_DIO and MaxBackground 512 (trap 3): io_uring and AIO
//     O_DIRECT requests stay asynchronous and parallel; 512 background
//     requests cover four disks at iodepth 128 (congestion threshold 3/4).
//
//   - O_DIRECT opens get FOPEN_DIRECT_IO|FOPEN_PARALLEL_DIRECT_WRITES (trap
//     4): the kernel does not serialise a file's direct writes on its inode
//     lock (it still does for writes that extend the file); overlapping
//     writes are ordered by the disk's range lock in image.
//
//   - Buffered opens get the same flags (direct_io), chosen by measurement:
//     see "Buffered opens" below. CAP_DIRECT_IO_ALLOW_MMAP keeps shared mmap
//     of a disk possible.
//
//   - FOPEN_NOFLUSH: close(2) sends no FLUSH; there is nothing to flush.
//
//   - GOMAXPROCS at least MinProcs (8), set by the daemon with TuneRuntime
//     before Mount: a request's goroutine holds its P through the blocking
//     /dev/fuse read and the O_DIRECT pread or pwrite, so with one P per
//     CPU on a 2-CPU machine the device saw about two requests in flight;
//     go-fuse also sizes its reader pool from GOMAXPROCS. See MinProcs for
//     why 8.
//
//   - FUSE-over-io_uring (Options.Transport, package fuseuring): after
//     INIT (with CAP_OVER_IO_URING) the connection's requests move to one
//     io_uring queue per CPU, served by a thread pinned to the next CPU and 64
//     long-lived workers per queue that run go-fuse's ProtocolServer over
//     the same RawFileSystem; /dev/fuse keeps INIT, FORGET, INTERRUPT and
//     notifications. Auto (the default) uses it when the kernel offers it
//     (PrepareTransport, called once before the mount, turns the fuse
//     module's enable_uring on as root); otherwise, or
//     when setting up the queues fails, it serves /dev/fuse and logs why.
//     The /dev/fuse descriptor is taken from go-fuse's Server by reflection
//     (go-fuse does not export it; TestTransports fails if that breaks).
//     Against /dev/fuse it served 4 KiB random I/O and 1 MiB writes at
//     iodepth 1 clearly faster, 1 MiB writes at iodepth 16 a little slower
//     (one CPU's queue thread does all the copying of that CPU's
//     requests); docs/BENCHMARKS.md, "Results: the FUSE door", runs on it.
//     Interrupts of requests on the ring find no request to cancel: they
//     run to completion (a disk request is short).
//
//   - Owner I/O (ownerIO, over the ring transport): a queue's owner thread
//     serves aligned READs and WRITEs within the disk's size itself:
//     image.Disk.PlanRead/PlanWrite map the request and take its range
//     without waiting, and the backing I/O goes on the queue's own ring, so
//     the request wakes no goroutine and blocks no thread. The backend
//     prepares the ring entries (backend.Submitter); the memory and crash
//     backends of tests perform the I/O at once instead, so the tests run
//     this path too. Requests are
//     found by node id, which is the disk's inode number (ExternalNodeID);
//     the disk handle used is any open one of that disk, pinned so that its
//     Release waits. A write into holes gets its blocks without waiting and
//     maps them when its I/O is done. Everything else (unaligned I/O,
//     growing writes, a full store, ranges held by other requests, failed
//     backing I/O) goes through go-fuse as before. Serving a request on the
//     owner saves a hand-off to a goroutine and back: small random I/O
//     gets lower tail latency and a fraction of the server's CPU per
//     request.
//
//   - MaxWrite 1 MiB (256 pages; max_read the same): one READ or WRITE is
//     one backend run, so dd bs=1M oflag=direct is one backend write per MiB.
//     MaxReadAhead is left to the kernel's limit (128 KiB); with direct_io
//     it only matters for mmap.
//
//   - st_blksize 1 MiB (at least the store block size): the preferred I/O
//     size, which cp and dd use for their buffers, so cp writes 1 MiB
//     requests. The price: cp --sparse=always finds holes in 1 MiB units
//     (hole_size = st_blksize of the destination), which also keeps the map
//     free of 4 KiB fragments; cp's default (holes from SEEK_HOLE of the
//     source) is exact.
//
//   - Attribute and entry timeouts 1 s, no negative caching (trap 10): every
//     size change (write past the end, truncate, fallocate without
//     KEEP_SIZE) and every name change goes through this mount, so the
//     kernel's cached size is right; a change made through the Store behind
//     the mount's back is announced with Server.InvalidateDisk.
//
//   - CAP_ATOMIC_O_TRUNC (trap 9): open(O_TRUNC) of cp and dd reaches Open,
//     which truncates in the same request.
//
//   - ioctl: not implemented, so go-fuse answers ENOTTY (trap 7; BLKSSZGET
//     must not get 0). The kernel answers FIGETBSZ, FICLONE and FIEMAP itself
//     (no FUSE request). STATX: go-fuse answers ENOSYS, on which the kernel
//     uses GETATTR from then on; that is its designed fallback.
//
//   - DisableXAttrs: disks have no extended attributes; the kernel learns
//     that once (ENOSYS) instead of asking for security.capability again.
//
//   - DisableSplice: read replies are memory we filled, written with writev;
//     splice only helps file-descriptor replies and fails (with a log line
//     each time) for 1 MiB ones, above the pipe size limit. Read returns
//     the request's buffer itself (inPlace), which go-fuse does not copy.
//
//   - default_permissions (the kernel checks modes against the catalog's
//     owner and mode), allow_other only on request, NullPermissions (mode
//     0000 is a mode), DirectMount with go-fuse's fallback to fusermount.
//
// # Buffered opens
//
// Opens without O_DIRECT (cp, dd, qemu-img with its default cache modes) get
// direct_io too. BenchmarkBufferedOpen mounts two stores side by side, one
// per mode, and alternates between them every iteration; its figures are in
// docs/BENCHMARKS.md, "Buffered opens". direct_io was faster for cp into the
// mount, dd writes, qemu-img convert (far more with -W) and cold 1 MiB
// reads; the page cache for cold 128 KiB reads (readahead) and, by orders
// of magnitude, for re-reads of cached data.
//
// Disk images are written and read in large sequential I/O, and a guest
// caches its own reads, so direct_io wins where it matters; the page cache
// wins re-reads of cached data and small sequential reads. direct_io also
// keeps every open coherent with the hypervisor's O_DIRECT one and with
// punch and truncate, lets qemu-img's parallel writers run in parallel (the
// page-cache write path holds the inode lock), and does not cache images
// twice.
//
// # Clones and snapshots
//
// COPY_FILE_RANGE between two disks of the mount, or within one, is
// image.Disk.CopyFrom: whole blocks become shared (no data I/O, O(extents)
// map work, one journal record), partial edge blocks and ranges placed
// differently in their blocks are copied. A copy of a whole disk into an
// empty one records it as a clone. One request copies at most 1 GiB
// (maxCopyChunk; the reply's count is 32 bits), and the kernel's callers
// loop. Who sends it, measured with coreutils 9.1 and QEMU 7.2 on 6.18:
//
//   - cp SRC DST of a disk without holes: one copy_file_range per GiB
//     (coreutils sparse_copy, after FICLONE, which FUSE answers EOPNOTSUPP
//     in the kernel without asking us). A source with holes goes through
//     SEEK_DATA/SEEK_HOLE, and coreutils 9.1 copies each data region with
//     read and write (later versions with copy_file_range, so they share).
//   - cp --sparse=always never uses copy_file_range: it reads everything
//     to find zeros itself, and writes the rest.
//   - qemu-img convert -C: copy_file_range of 2 MiB per data region, 8 in
//     parallel; it writes the target's first block before, as for every
//     new raw image.
//
// On 6.18 the kernel tries FUSE_COPY_FILE_RANGE_64 first; go-fuse v2.12
// answers it ENOSYS and the kernel falls back to FUSE_COPY_FILE_RANGE for
// the rest of the mount (it sets no_copy_file_range_64, not
// no_copy_file_range).
//
// A snapshot (image.Store.Snapshot; Server.Snapshot on a mount, which
// `vdisk snapshot MOUNTPOINT/DISK NAME` reaches through the mount's socket)
// is a read-only disk: an open for writing (O_WRONLY, O_RDWR, O_TRUNC) and
// a truncate fail with EROFS, so no write, fallocate or copy can reach it.
// chmod, chown and utimes are allowed (they change the catalog, not the
// data); rename, unlink and cp from it (into a writable clone) work.
// st_blocks of every disk counts all its mapped blocks, shared or not (as
// XFS reports reflinked files); statfs counts each block of the store once.
//
// # Errors
//
// Only syscall.Errno reaches go-fuse, through vfs.toErrno, which logs each
// failure once with the fields op, disk, errno (and offset, length, mode
// where they apply): quietly (debug level) for errno a caller causes on
// purpose (ENOENT, EEXIST, ENXIO, EINVAL, ...), as a warning for ENOSPC and
// EFBIG, as an error for the rest.
//
//	image.ErrFailed, image.ErrClosed   EIO (whatever they wrap)
//	image.ErrNoSpace                   ENOSPC
//	image.ErrNotExist                  ENOENT
//	image.ErrExist                     EEXIST
//	image.ErrInvalidName               EINVAL; ENAMETOOLONG past 255 bytes
//	image.ErrInvalid                   EINVAL
//	image.ErrTooLarge                  EFBIG
//	image.ErrNoData                    ENXIO
//	image.ErrReadOnly                  EROFS
//	image.ErrReadOnlyDisk              EROFS (a snapshot)
//	a wrapped syscall.Errno            itself
//	anything else                      EIO
//
// # Concurrency and locking
//
// go-fuse runs every request in its own goroutine: reads, writes, fsyncs
// and fallocates of one file run in parallel with each other and with
// lookups, opens, renames and unlinks. The state they share:
//
//   - diskNode.id never changes. diskNode.name is an atomic hint for
//     requests without an open file (path stat, chmod, truncate, open); it is
//     checked against the id on every use and repaired from the catalog when
//     stale, so a rename racing with such a request never reaches another
//     disk.
//   - diskFile is immutable after Open: one image.Disk handle, whose methods
//     are safe for concurrent use; overlapping requests are ordered by the
//     disk's range lock in image. The kernel sends RELEASE only after the
//     last request on the handle, and go-fuse holds RELEASE while a GETATTR
//     borrows the handle.
//   - vfs.mu guards the set of open files, so a request without a handle on
//     a disk unlinked while open can borrow one (fn runs under vfs.mu, which
//     also keeps Release from closing it meanwhile), and so that handles the
//     kernel never released are closed when serving ends (RELEASE is
//     asynchronous and can be lost at unmount). It is never held across a
//     call into go-fuse.
//   - The catalog is the only truth about names; the root node keeps no
//     list. RENAME_NOREPLACE checks then renames: atomic against this mount's
//     requests, because the kernel holds the directory's lock across RENAME,
//     CREATE, MKNOD and UNLINK.
//
// The process serving the mount must not page-fault on it (mmap) nor hold
// its files across a fork-exec in ways go-fuse's fs/api.go "Deadlocks"
// section describes; tests map files from a child process.
package fs
