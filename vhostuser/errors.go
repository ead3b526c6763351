package vhostuser

import "errors"

var (
	// ErrProtocol: a frontend message the session cannot accept (wrong
	// order, a queue index out of range, a missing descriptor).
	ErrProtocol = errors.New("vhostuser: protocol error")
	// ErrBusy: a frontend connected while another is served.
	ErrBusy = errors.New("vhostuser: a frontend is already connected")
)
