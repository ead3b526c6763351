// Package blk serves a disk as a vhost-user-blk device: a virtio-blk
// device whose virtqueues live in the frontend's (the VM's) memory, which
// the frontend shares with this process over a Unix socket (package
// vhostuser carries the protocol, package vhostuser/virtq the rings).
//
// The public API is Serve, the Disk the device serves, and the Server's
// ConfigChanged, Close and Stats.
package blk
