package frontend

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Features is the virtio feature set acked to the device.
func (d *Device) Features() uint64 { return d.features }

// ProtocolFeatures is the protocol feature set acked to the device.
func (d *Device) ProtocolFeatures() uint64 { return d.protocol }

// Config is the config space as last read (at setup, RefreshConfig).
func (d *Device) Config() proto.BlkConfig {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.cfg
}

// RefreshConfig reads the config space again (after a ConfigChanges
// signal).
func (d *Device) RefreshConfig() (proto.BlkConfig, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.getConfigLocked()
	return d.mu.cfg, err
}

// ConfigChanges is signalled when the backend sends CONFIG_CHANGE_MSG (a
// resize); several changes may coalesce into one signal.
func (d *Device) ConfigChanges() <-chan struct{} { return d.configChanges }

// Queues are the device's queues.
func (d *Device) Queues() []*Queue { return d.queues }

// Alloc returns n zeroed bytes of guest memory aligned to align.
func (d *Device) Alloc(n, align int) (Buffer, error) { return d.mem.alloc(n, align) }

// Free returns a buffer from Alloc.
func (d *Device) Free(b Buffer) { d.mem.release(b) }

// Dead is closed when the current connection to the backend ends (the
// backend died or closed it): time to Reconnect.
func (d *Device) Dead() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.conn.dead
}

// Reconnect drops the connection, dials the socket again until it
// answers (within Options.ReconnectTimeout) and sets the same memory,
// inflight region and queues up on the new backend. Requests in flight
// stay in flight. With INFLIGHT_SHMFD the new backend resubmits them from
// the inflight region, and queue owners may keep running meanwhile.
// Without it the frontend resubmits them itself (each queue's in-flight
// requests go back on its available ring after the last used entry), and
// no queue owner may run during Reconnect.
func (d *Device) Reconnect() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.conn.close()
	deadline := time.Now().Add(d.opts.ReconnectTimeout)
	for {
		s, err := d.connect()
		if err == nil {
			d.mu.conn = s
			return d.setupLocked(false)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reconnect: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close disconnects and frees the guest memory (unless shared:
// Options.Memory); the queues and buffers are gone with it.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.conn != nil {
		d.mu.conn.close()
		d.mu.conn = nil
	}
	for _, q := range d.queues {
		q.release(d.mem)
	}
	d.queues = nil
	if d.inflight.fd >= 0 {
		unix.Close(d.inflight.fd)
		d.inflight.fd = -1
	}
	if !d.ownMem {
		return nil
	}
	return d.mem.close()
}

// Segments returns the BlkSeg array of a discard or write-zeroes request
// in a new buffer (Free it after the request).
func (d *Device) Segments(segs ...proto.BlkSeg) (Buffer, error) {
	b, err := d.Alloc(len(segs)*proto.BlkSegSize, 8)
	if err != nil {
		return Buffer{}, err
	}
	for i, s := range segs {
		s.Put(b.Bytes[i*proto.BlkSegSize:])
	}
	return b, nil
}
