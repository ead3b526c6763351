// Package backend is the seam between a store and its storage: every byte a
// store reads or writes, every flush and every discard goes through the
// Backend interface. Production backends do aligned O_DIRECT I/O on a regular
// file (File) or a block device (Device); test backends keep the image in
// memory (Mem) or also record every write so that a test can cut power at any
// point and tear unflushed writes (Crash).
//
// # The contract
//
// ReadAt and WriteAt transfer all of p or fail; a short transfer is an error
// wrapping io.ErrUnexpectedEOF. For File and Device, the offset, the length
// and the address of p must be multiples of SectorSize(), the O_DIRECT rule;
// buffers from github.com/ncw/directio (4096-aligned) always qualify. I/O
// outside [0, Size()) is refused with ErrOutOfRange, never grows a file. Mem
// and Crash enforce the same rules after CheckAlignment(sectorSize), so tests
// run on memory catch what O_DIRECT would refuse.
//
// A completed WriteAt may sit in a volatile cache (the disk's write cache and,
// for a file, the file system's record of newly allocated blocks) until Flush. Flush makes every write that
// completed before Flush was called durable: fdatasync for a file (which also
// persists the allocation of blocks written into holes), fsync for a block
// device (a cache flush). A failed Flush guarantees nothing.
//
// Discard says that [off, off+n) is no longer used. It is advice: afterwards
// the range may read as zeros, as the old data, or as anything else, and it
// returns an error wrapping ErrUnsupported when the backing cannot discard
// (the caller may ignore that error). File punches a hole (fallocate
// PUNCH_HOLE|KEEP_SIZE), which frees the space and reads as zeros; Device
// issues BLKDISCARD for the whole discard units (queue/discard_granularity)
// inside the range, and does nothing for a range holding none.
//
// WriteZeroes makes [off, off+n) read as zeros, as a write would, so it is
// subject to Flush like a write. File uses fallocate ZERO_RANGE|KEEP_SIZE,
// falling back to PUNCH_HOLE and then to writing zero buffers; Device uses
// BLKZEROOUT, falling back to writing zero buffers.
//
// Discard and WriteZeroes take offsets and lengths in multiples of
// SectorSize(), like ReadAt and WriteAt.
//
// Size is fixed at open: st_size for a file, BLKGETSIZE64 for a device.
// SectorSize is the device's logical block size (BLKSSZGET) for a Device. For
// a File it is the alignment the file system reports through
// statx(STATX_DIOALIGN) (512 on ext4 or xfs over a 512-byte-sector disk), or
// 4096 when it reports none. A store reads SectorSize at open rather than
// assume 512: it is a power of two of at least 512, in practice 512 or 4096.
//
// # I/O engines
//
// File and Device issue ReadAt through an engine chosen at Open
// (OpenOptions.Engine). EngineIOUring hands reads to one io_uring (package
// uring) whose owner thread submits whatever callers have queued in one
// io_uring_enter, so that the reads of concurrent FUSE requests reach the
// block layer under one plug and the device is notified once for them;
// EnginePread is one pread per call on the caller's thread. WriteAt is one
// pwrite on the caller's thread with either engine (see EngineIOUring for
// the measurement).
// EngineAuto, the default, takes io_uring when the kernel gives one and
// falls back to pread (EngineOf says which, and why). A mount served over
// FUSE-over-io_uring opens its store with pread instead (fs.StoreEngine):
// there the request already arrives on a ring, and a second ring per read
// measured slower. Flush, Discard and
// WriteZeroes are system calls on the caller's thread with either engine;
// a WriteAt has completed (its CQE is reaped) before it returns, so a
// later Flush covers it.
//
// # Submission
//
// Data I/O (IO: a read into or a write from a caller's buffer) has one
// seam, whichever thread issues it. Do(b, io) performs an IO synchronously
// on any Backend through ReadAt, WriteAt or WriteAtDurable. A Submitter
// (File, Device, Mem, Crash) also takes IOs from a submission loop that
// must not block, such as a FUSE-over-io_uring queue's owner thread:
//
//   - PrepareSQE fills an entry of the caller's io_uring with the IO.
//     File and Device do so while open (a read or write of their O_DIRECT
//     descriptor, RWF_DSYNC for a Durable write); Mem and Crash never do.
//     The caller submits the entry before Close, keeps the buffer valid
//     until the completion arrives on its ring, and treats a completion
//     of anything but len(Buf) bytes as a failure. The descriptor never
//     leaves this package: only the entry carries it, to the kernel.
//   - Do performs the IO at once when PrepareSQE says false: in memory for
//     Mem and Crash (through Crash's fault function and op log, so
//     injected errors and power cuts see it), and for File and Device,
//     which say false only when closed or for an IO that breaks the rules,
//     an error without any I/O. So on a Submitter, Do after a false
//     PrepareSQE never waits for a device.
//
// An AsyncSubmitter (RBD, and Async for tests) is the seam for a backend
// whose every I/O waits for something outside the machine, so that no Do
// could avoid blocking: the submission loop starts the I/O itself and
// reaps its completion later, on its own thread.
//
//   - NewCompletionQueue gives the loop a CompletionQueue of its own.
//   - Start starts an IO without waiting, with a tag of the caller's; an
//     error is an IO that did not start, and nothing comes back for it.
//     The buffer stays the caller's to keep valid until the completion.
//   - Fd is an eventfd the loop reads (a FUSE queue's owner keeps a read
//     of it armed on its io_uring); once the read completes, Reap hands
//     out every completion waiting as (tag, result), the result being the
//     bytes transferred or -errno, as in an io_uring completion. A
//     completion that arrives after Reap took the waiting ones writes the
//     eventfd again, so a loop that reads it, reaps, and arms the read
//     again misses none.
//   - Close, after the last completion was reaped, frees the queue.
//
// Alignment is ReadAt's (multiples of SectorSize() for offset, length and
// buffer address). Durable is WriteAtDurable's promise: the IO's bytes are
// durable when it completes, and no other write is made durable by it.
// Either way an IO is unordered with respect to other IOs in flight; a
// Flush covers the IOs whose completion the caller has seen before
// calling it. A wrapper that embeds a Backend (a test's gate or delay) is
// not a Submitter, since its methods may block: callers that must not
// block serve such a backend's requests elsewhere, with ReadAt and WriteAt.
//
// # Opening, locking and errors
//
// Open takes flock(LOCK_EX|LOCK_NB) on the backing (LOCK_SH when read-only)
// and Close releases it; a second opener gets an error wrapping ErrLocked that
// names the path. The lock is on the inode: two different device nodes for
// one device do not see each other's locks, but a block device opened
// read-write is also opened with O_EXCL, which the kernel refuses (ErrLocked
// too) while the device is mounted or claimed by another exclusive opener. A
// file system that refuses O_DIRECT (ramfs), or accepts it but keeps the data
// in memory (tmpfs since Linux 6.6), gives ErrNoDirectIO with a message saying
// where to put the store instead. CreateFile makes a new sparse file
// for a store. Kernel errors keep their errno reachable through the wrapping:
// errors.Is(err, syscall.EIO) and errors.Is(err, syscall.ENOSPC) work.
//
// # RBD
//
// RBD (build tag rbd; see rbd_stub.go for what other builds say) is a
// Backend on a Ceph RBD image through librbd (github.com/ceph/go-ceph
// v0.28.0 for the connection, Ceph Pacific and later), opened by Open with
// an RBD store name, rbd:POOL/IMAGE[:id=USER][:conf=FILE][:OPTION=VALUE...]
// (RBDName; QEMU's syntax). go-ceph has only librbd's synchronous calls and
// no access to its image handle, so the backend opens the image itself
// (rbd_open on go-ceph's I/O context, rbd_image.go) and does its I/O with
// librbd's asynchronous API (rbd_aio.go). Every operation completes
// through a completion queue in C memory: librbd's completion callback,
// pure C on librbd's completion thread, queues the operation's result
// under a C mutex and writes the queue's eventfd. ReadAt, WriteAt, Flush
// (rbd_aio_flush), Discard (rbd_aio_discard) and WriteZeroes
// (rbd_aio_write_zeroes, which librbd makes a discard without granularity,
// so the whole range reads zeros) start the operation on the backend's own
// queue and park the calling goroutine until one poller goroutine, woken
// through the netpoller by that queue's eventfd, reaps it. An I/O in
// flight holds no OS thread, at any depth. RBD is also an AsyncSubmitter:
// a FUSE queue's owner gets a queue of its own and reaps it on its ring.
// librbd starts each operation on the calling thread (rbd_non_blocking_aio
// off unless the name sets it). librbd's cache is turned off unless the
// name sets rbd_cache: a completed write is then on every replica,
// WriteAtDurable is WriteAt,
// and Flush has nothing to wait for. Size is the image's at open;
// SectorSize is 512 (librbd takes any byte range; the checks are
// O_DIRECT's anyway, so a store issues the same I/O on every backend).
// Failures carry librbd's errno; EROFS (another client holds the lock now)
// and ESHUTDOWN (this client was blocklisted) wrap ErrFenced.
//
// RBD is not a Submitter: it has no descriptor for a caller's io_uring,
// and every I/O waits for the network, so there is no Do that does not
// block. It is an AsyncSubmitter instead: a FUSE-over-io_uring queue's
// owner starts reads and writes on its own completion queue (rbd_aio_read,
// rbd_aio_write) and reaps them when its ring's read of the queue's
// eventfd completes, so a 4 KiB request wakes no goroutine and no thread
// of the server but the owner. A durable write started there needs
// librbd's cache off (the default here); with it on, Start refuses it and
// the store's workers serve synchronous writes with WriteAtDurable.
//
// Fencing is the image's exclusive lock, not flock. A read-write Open
// takes it with rbd_lock_acquire in exclusive mode, after which librbd
// never passes it to another client on request: a second opener, on any
// host, gets ErrLocked naming the holder (client.N, address, cookie). A
// holder that dies keeps the lock until its watch on the image times out
// (osd_client_watch_timeout, 30 s by default); the next read-write Open
// then has librbd blocklist it and break its lock, which is why
// FencesOtherHosts is true. BreakLock does that at once, for a holder that
// is alive or not known to be dead: once blocklisted, its I/O fails with
// ESHUTDOWN, so it can never write again. A read-only Open takes no lock
// and refuses an image whose holder is alive (it has a watch), as LOCK_SH
// refuses a file with a writer.
//
// # Test backends
//
// Mem keeps the image in 4 KiB copy-on-write pages (a page never written
// costs nothing), counts calls (Stats), and after CheckAlignment refuses what
// O_DIRECT would refuse. Close keeps the contents; Reopen makes it usable
// again, as reopening the device would.
//
// Crash records an op log of every successful write, discard, write-zeroes
// (both logged as writes of zeros) and flush in completion order; reads see
// every completed write at once, like a volatile cache. StateAt(op, rng,
// mode) returns a possible content of the device after a power cut right
// after op: the writes before the last flush at or before op, plus, according
// to mode, none (DropUnflushed), a random subset (RandomSubset), or a random
// subset of random sectors (Torn) of the writes after it. FlushOps lists the
// cut points at flush boundaries. MemAt and CrashAt return that state as a
// Mem to recover on, or as a new Crash to cut power again during recovery;
// they share pages with the original and cost tens of microseconds for a
// 16 MiB image (well under a millisecond with -race), where StateAt copies
// the whole image. SetFault injects errors (FailNth for the common case): a
// failed operation is not performed and not recorded, so a failed flush makes
// nothing durable.
//
// # Concurrency
//
// All methods of all backends are safe for concurrent use. On File and Device,
// ReadAt, WriteAt, Flush, Discard and WriteZeroes run in parallel with each
// other (no lock is held across I/O, only a read lock that keeps Close from
// closing the descriptor under them); Close waits for running operations.
// Overlapping concurrent writes leave an unspecified mix, as on a real disk;
// ordering them is the store's job. Mem and Crash serialise their operations,
// which for Crash defines the completion order recorded in the log.
package backend
