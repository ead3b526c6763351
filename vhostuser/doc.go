// Package vhostuser is the backend side of the vhost-user protocol
// (QEMU's docs/interop/vhost-user.rst): a Listener takes one frontend at a
// time on a Unix socket and runs its session, which negotiates features,
// maps the frontend's memory table, sets up the virtqueues (package
// virtq) and hands each ready queue to a Device, which serves it on a
// goroutine of its own (package vhostuser/blk is the virtio-blk device).
//
// # Session
//
// A session reads one message at a time and answers it before the next
// (replies, and REPLY_ACK when the frontend asked for it). A queue is
// handed to the Device (StartQueue) once it has a size, addresses, a kick
// descriptor and a memory table, and is enabled (with
// VHOST_USER_F_PROTOCOL_FEATURES the rings start disabled, until
// SET_VRING_ENABLE); it is taken back (StopQueue, which returns when the
// device has completed every request it took) by GET_VRING_BASE,
// SET_VRING_ENABLE 0, a new memory table, RESET_OWNER, RESET_DEVICE and
// the end of the connection. The memory table's mappings are unmapped only
// with every queue stopped.
//
// # Inflight
//
// With VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD the backend creates the
// inflight region (GET_INFLIGHT_FD: a memfd, zeroed) which the frontend
// keeps and hands back to a new backend after a restart (SET_INFLIGHT_FD);
// each queue's ring records the heads in flight there, and a queue started
// over a region a previous backend used resubmits them (package virtq).
//
// # What the frontend can do
//
// Messages are bounded and checked (package proto); queue indexes, sizes
// and ring addresses are checked against the session's state and the
// memory table; a region or inflight area that would map past the end of
// its file is refused, so that touching it cannot fault. What the guest
// writes into shared memory is package virtq's to check. A frontend that
// shrinks a shared file after handing it over can still make the daemon
// fault: the frontend (the hypervisor) is trusted that far, as by every
// vhost-user backend.
//
// # Concurrency
//
// A Listener's session runs on one goroutine, which alone touches the
// session's state. Device methods are called from it; ConfigChanged may
// be called from any goroutine (Listener.mu guards the backend channel).
// A second frontend that connects while one is served is refused (closed)
// and logged.
package vhostuser
