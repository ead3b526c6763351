// Package virtq is the device side of split virtqueues (virtio 1.2,
// section 2.7) in memory shared by a vhost-user frontend.
//
// # Memory
//
// A Memory is the frontend's memory table: regions of guest-physical
// addresses, each also known by the frontend's own (userspace) address,
// mapped into this process. Every address the frontend or the guest gives
// (ring addresses, descriptor buffers, indirect tables) is translated
// through it into a []byte of a mapping, bounds-checked: a range that is
// not wholly inside one region is refused, so nothing the guest writes
// can make the device touch memory outside the shared regions.
//
// # Rings
//
// A Ring is one virtqueue: the descriptor table, the available ring
// (written by the driver, read here) and the used ring (written here).
// Pop takes the next available chain and walks it into a Chain (its
// buffers as slices of the mapping, readable ones first); Push returns it
// on the used ring; NeedSignal says whether the driver asked to be
// interrupted (VIRTIO_F_EVENT_IDX's used_event, or the avail ring's
// NO_INTERRUPT flag); EnableNotify publishes avail_event (or clears the
// used ring's NO_NOTIFY flag) before the device sleeps, and reports
// whether more became available meanwhile.
//
// A chain that breaks the rules (a descriptor outside the memory table,
// a loop, more descriptors than the table holds, a readable descriptor
// after a writable one, a bad or nested indirect table, buffers that
// overlap, more bytes than the limit) is refused with an error wrapping
// ErrBadChain; its head is still consumed so the device can return it. A
// bad buffer (outside the memory table, out of order, past the limits) is
// left out and the walk goes on, so that the device still finds the
// chain's last writable byte to answer in (virtio-blk's status); a broken
// structure (a loop, a next past the table, a bad indirect table) ends
// the walk where it is.
//
// # Inflight
//
// An Inflight is one queue's part of the inflight region
// (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD, split-ring format as in QEMU's
// libvhost-user): a record of which heads the device took and has not
// returned, kept in memory the frontend holds across a backend restart,
// so that a new backend resubmits them (Ring.Resubmit).
//
// # Memory ordering
//
// The rings are shared with another CPU without locks. Indexes are read
// and written through non-inlined accessors (so the compiler neither
// caches nor reorders them across the accessor), and a full fence
// (an atomic read-modify-write) separates the device's store of an index
// from its next load of the driver's (the store-load orders of the
// EVENT_IDX protocol). Loads after loads and stores after stores are
// ordered by the hardware on amd64 (TSO), the platform vdiskfs runs on.
//
// # Concurrency
//
// A Memory is immutable once built (the session replaces it whole, with
// every queue stopped). A Ring, its Chains and its Inflight belong to one
// goroutine, the queue's owner.
package virtq
