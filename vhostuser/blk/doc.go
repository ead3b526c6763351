// Package blk serves a disk as a vhost-user-blk device: a virtio-blk
// device whose virtqueues live in the frontend's (the VM's) memory, which
// the frontend shares with this process over a Unix socket (package
// vhostuser carries the protocol, package vhostuser/virtq the rings).
// Serve takes a Disk, which an adapter provides from the store (package
// door/blkdisk), so that this package imports nothing of package image.
//
// # The device
//
// Features: VIRTIO_F_VERSION_1, RING_F_INDIRECT_DESC, RING_F_EVENT_IDX;
// virtio-blk SIZE_MAX, SEG_MAX, BLK_SIZE, TOPOLOGY, FLUSH, MQ, DISCARD,
// WRITE_ZEROES; protocol features MQ and CONFIG (the session adds
// REPLY_ACK, BACKEND_REQ, INFLIGHT_SHMFD, RESET_DEVICE). The logical block
// is 512 bytes, so 512-byte-aligned I/O works as on a disk; the store's
// block is the physical block, the minimum I/O and the discard alignment.
// The write cache is volatile (FLUSH, no CONFIG_WCE): a FLUSH is exactly
// what fsync(2) on the disk's file does (Disk.Flush).
//
// # One owner per queue
//
// Each started queue has an owner goroutine, locked to its thread, with an
// io_uring of its own, on which it keeps reads armed of the queue's kick
// eventfd, of its own wake eventfd and of the backend's completion queue
// (door.Completions), and sleeps in io_uring_enter. It takes the requests
// the driver made available into its slots (one per ring entry), and for a
// read or write whose data is one contiguous piece (buffers next to each
// other in guest and in host memory are one) plans it with the Disk's IO
// straight into or out of guest memory, and issues the plan's backing I/O
// on its ring (door.Plan.PrepareSQE), on its completion queue (Start) or at
// once (Do), submitting the ring every few small requests of a burst
// (door.SubmitNow). No copy and no allocation per request: the slots, their
// chains and the plans are reused. A read or write whose data is scattered
// over several pieces (a guest's buffer over its pages) is staged: planned
// as one range of one pooled buffer (request.stage), so that the store sees
// one large request, not one per guest page; one larger than maxStaged is
// planned piece by piece. When the range and the pieces are block-aligned,
// the pieces large (vectorMinPiece: buffers on huge pages in the guest) and
// the disk plain, the stage is only the planned range: each backing I/O is
// made vectored over the pieces it covers (iouring.Vectored) and nothing is
// copied (request.direct); otherwise (and when the plan has holes to read,
// or I/O not on the ring) the owner fills the stage from the pieces before
// a write and copies it out to them after a read. What it cannot plan
// (unaligned pieces, holes the planner would wait for, more than maxPieces
// pieces), FLUSH, DISCARD, WRITE_ZEROES, and plans whose I/O failed or came
// back short go to the queue's workers, on the blocking path (Disk.ReadAt,
// WriteAt, Flush, Discard, WriteZeroes), which reports errors. GET_ID and
// unsupported types are answered at once. The owner never parks, so it
// passes through the Go scheduler every few milliseconds (iouring.Yielder):
// else the runtime would preempt it every time slice and its monitor thread
// would poll while it sleeps.
//
// # Writes survive a daemon restart
//
// A frontend that reconnects (QEMU's reconnect=) hides a daemon restart
// from the guest, which then flushes on the new daemon: every write the
// old one returned must be readable there. With a Restartable Disk, a
// write whose mappings wait for a commit is held, and the committer
// returns every write held with one commit (group commit) to its owner,
// which then returns it. The inflight region (package virtq) resubmits
// what was taken and not returned.
//
// # Bad input
//
// A chain that breaks the ring's rules, a request too short for a header
// and a status, a length that is not a multiple of 512, a range past the
// disk's end: VIRTIO_BLK_S_IOERR (in the last writable byte the chain
// has), a log line and a count, never a panic nor an access outside the
// shared memory. A ring whose indexes break the rules is not served any
// more (logged).
//
// # Concurrency
//
// A slot belongs to its owner, or to the one worker or the committer it
// was handed to, which hands it back (owner.finish); only the owner
// touches the ring, its io_uring and its completion queue. device.mu
// guards the owners; owner.mu the slots handed back and the owner's
// sleep; committer.mu the writes waiting for a commit. Counters are
// atomic. StopQueue returns once every request the owner took has been
// returned on the used ring, so the session may unmap guest memory.
package blk
