package vhostuser

import "github.com/vdiskfs/vdiskfs/vhostuser/virtq"

// Device is a virtio device a session serves (package vhostuser/blk).
// The session calls its methods from its own goroutine, one at a time.
type Device interface {
	// Features are the virtio feature bits the device offers (device,
	// ring and VIRTIO_F_VERSION_1); the session adds
	// VHOST_USER_F_PROTOCOL_FEATURES.
	Features() uint64
	// ProtocolFeatures are the protocol features the device wants
	// offered (CONFIG for one with a config space, MQ); the session adds
	// those it implements itself (REPLY_ACK, BACKEND_REQ, INFLIGHT_SHMFD,
	// RESET_DEVICE).
	ProtocolFeatures() uint64
	// NumQueues is the most queues (GET_QUEUE_NUM).
	NumQueues() int
	// QueueLimits are the chain limits of its queues (MaxBufs, MaxBytes);
	// the session sets the ring features.
	QueueLimits() virtq.Options
	// Config returns the config space as it is now (GET_CONFIG).
	Config() []byte
	// SetConfig writes data at offset of the config space (SET_CONFIG).
	SetConfig(offset uint32, data []byte) error
	// StartQueue starts serving q. The device owns q until StopQueue.
	StartQueue(q *Queue) error
	// StopQueue stops serving queue index and returns once every request
	// it took from the ring has been returned on the used ring.
	StopQueue(index int)
	// Reset is called when the frontend resets the device or goes away,
	// every queue stopped.
	Reset()
}

// Queue is one virtqueue ready to serve.
type Queue struct {
	Index int
	Ring  *virtq.Ring
	// Kick is an eventfd the frontend writes when it made entries
	// available; Call one the device writes to interrupt the driver (-1:
	// none). Both stay the session's: the device neither closes them nor
	// uses them after StopQueue.
	Kick, Call int
	// Resubmitted is how many heads the ring gives again first, taken by
	// a previous backend and never returned (virtq.Ring.SetInflight).
	Resubmitted int
}
