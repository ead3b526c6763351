package proto

import (
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// oobSize is the control buffer for MaxFDs descriptors.
var oobSize = unix.CmsgSpace(MaxFDs * 4)

// ReadMessage reads one message and the descriptors sent with it. At a
// clean end of stream (no byte of a header read) it returns io.EOF. A
// malformed message (see the package doc) is an error wrapping
// ErrMalformed; the stream is then out of step and the caller should drop
// the connection. On any error, descriptors received are closed.
func ReadMessage(c *net.UnixConn) (Message, error) {
	var hdr [HeaderSize]byte
	var fds []int
	fail := func(err error) (Message, error) {
		closeFDs(fds)
		return Message{}, err
	}
	n, err := readFull(c, hdr[:], &fds)
	if err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return fail(io.EOF)
		}
		return fail(fmt.Errorf("vhost-user header: %w", err))
	}
	request, flags, size, err := decodeHeader(hdr[:])
	if err != nil {
		return fail(err)
	}
	payload := make([]byte, size)
	if _, err := readFull(c, payload, &fds); err != nil {
		return fail(fmt.Errorf("vhost-user %v payload: %w", Request(request), err))
	}
	return Message{Request: request, Flags: flags, Payload: payload, FDs: fds}, nil
}

// readFull reads len(b) bytes, collecting the descriptors of any control
// message into *fds (at most MaxFDs in all). A stream that ends partway
// is io.ErrUnexpectedEOF; one that ends before any byte is io.EOF.
func readFull(c *net.UnixConn, b []byte, fds *[]int) (int, error) {
	oob := make([]byte, oobSize)
	got := 0
	for got < len(b) {
		n, oobn, flags, _, err := c.ReadMsgUnix(b[got:], oob)
		if oobn > 0 {
			if perr := parseRights(oob[:oobn], fds); perr != nil && err == nil {
				err = perr
			}
		}
		if err == nil && flags&unix.MSG_CTRUNC != 0 {
			err = fmt.Errorf("%w: more than %d file descriptors", ErrMalformed, MaxFDs)
		}
		got += n
		if err != nil {
			if errors.Is(err, io.EOF) && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return got, err
		}
		if n == 0 {
			if got == 0 {
				return 0, io.EOF
			}
			return got, io.ErrUnexpectedEOF
		}
	}
	return got, nil
}

// parseRights appends the descriptors of SCM_RIGHTS control messages in
// oob to *fds; other control messages are malformed. Descriptors over
// MaxFDs are closed and make an error.
func parseRights(oob []byte, fds *[]int) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("%w: control message: %v", ErrMalformed, err)
	}
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("%w: control message level %d type %d", ErrMalformed, m.Header.Level, m.Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = fmt.Errorf("%w: SCM_RIGHTS: %v", ErrMalformed, err)
			continue
		}
		for _, fd := range got {
			if len(*fds) >= MaxFDs {
				unix.Close(fd)
				bad = fmt.Errorf("%w: more than %d file descriptors", ErrMalformed, MaxFDs)
				continue
			}
			*fds = append(*fds, fd)
		}
	}
	return bad
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// WriteMessage writes m with its descriptors (sent with the header, as
// QEMU does). The descriptors stay the caller's. Flags should carry
// Version; WriteMessage sets it if the version bits are zero.
func WriteMessage(c *net.UnixConn, m Message) error {
	if len(m.Payload) > MaxPayload {
		return fmt.Errorf("%w: %v: payload of %d bytes (most %d)", ErrMalformed, Request(m.Request), len(m.Payload), MaxPayload)
	}
	if len(m.FDs) > MaxFDs {
		return fmt.Errorf("%w: %v: %d file descriptors (most %d)", ErrMalformed, Request(m.Request), len(m.FDs), MaxFDs)
	}
	flags := m.Flags
	if flags&FlagVersionMask == 0 {
		flags |= Version
	}
	b := make([]byte, HeaderSize+len(m.Payload))
	encodeHeader(b, m.Request, flags, len(m.Payload))
	copy(b[HeaderSize:], m.Payload)
	var oob []byte
	if len(m.FDs) > 0 {
		oob = unix.UnixRights(m.FDs...)
	}
	for len(b) > 0 {
		n, _, err := c.WriteMsgUnix(b, oob, nil)
		if err != nil {
			return fmt.Errorf("write vhost-user %v: %w", Request(m.Request), err)
		}
		b = b[n:]
		oob = nil
	}
	return nil
}
