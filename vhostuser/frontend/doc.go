// Package frontend is a small vhost-user-blk frontend (the driver side,
// what QEMU or cloud-hypervisor are to a backend), for tests without a VM
// and for the compare tool's load generator.
//
// Dial connects to a backend's socket and sets a device up as QEMU 7.2's
// vhost-user-blk does: it acks VERSION_1, RING_EVENT_IDX,
// RING_INDIRECT_DESC and the virtio-blk features it knows when offered,
// and the protocol features MQ, CONFIG (required), REPLY_ACK,
// INFLIGHT_SHMFD and BACKEND_REQ; it shares guest memory as one memfd
// mapped at guest physical address 0 (SET_MEM_TABLE) — its own, or a
// Memory several devices share (Options.Memory) —, reads the config
// space, gets the inflight region, and sets up split virtqueues with kick
// and call eventfds, all enabled.
//
// Requests are virtio-blk requests (Request) on a Queue, with data in
// guest memory (Device.Alloc): Submit, Kick, then Poll for completions
// and Wait for the device's call. Reconnect dials the socket again after
// the backend died and sets up the same memory, inflight region and
// queues, so that the new backend resubmits what was in flight.
//
// # Invariants
//
// Each Queue's descriptors are either free (in its free list) or part of
// exactly one request in flight, whose head indexes its slot, header and
// status byte. The avail index is published with an atomic store after
// the descriptors are written; the used index is read with an atomic load
// before the used elements.
//
// # Concurrency
//
// A Queue belongs to one goroutine at a time (its owner); several queues
// may run in parallel. Device methods may be called from any goroutine:
// Device.mu serialises the requests on the socket. Reconnect may run
// while queue owners submit and poll.
package frontend
