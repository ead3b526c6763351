// Package proto is the wire format of the vhost-user protocol as a
// vhost-user-blk device uses it: message codes, header flags, the payload
// structs and their little-endian encoding, the feature bits of
// vhost-user, virtio and virtio-blk, the split virtqueue layout, and
// reading and writing one message with its file descriptors over a Unix
// socket.
//
// A control message's fixed structure is declared field by field in wire
// order, padding as blank fields, and encoding/binary moves it: the
// declaration is the layout, and the tests pin its size and offsets. The
// structures of the data path, read and written for every request (a
// descriptor, a request header), have explicit codecs that do not
// allocate.
//
// The numbers are those of QEMU's docs/interop/vhost-user.rst, the virtio
// 1.2 specification (split virtqueues, virtio-blk) and Linux's
// include/uapi/linux/virtio_blk.h and virtio_ring.h; every constant here
// is part of the format and never changes.
//
// # Messages
//
// A message is a 12-byte header (request, flags, payload size; each a
// little-endian u32) followed by the payload; file descriptors travel
// beside the header in one SCM_RIGHTS control message. ReadMessage bounds
// the payload at MaxPayload and the descriptors at MaxFDs, and a message
// that breaks either bound, has a wrong version or ends early is an error
// wrapping ErrMalformed (the descriptors it carried are closed), never a
// panic. The Decode functions check the payload's length before reading
// it and wrap ErrMalformed likewise.
//
// # Concurrency
//
// The package has no state. ReadMessage and WriteMessage may run at once
// on one connection (one reader, one writer), as a frontend that waits for
// a reply while a backend request arrives needs; two readers or two
// writers on one connection must be serialised by the caller.
package proto
