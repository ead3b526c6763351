package telemetry

// Who may use the control socket, and which disks they may read through it.
//
// Every connection is asked who made it (SO_PEERCRED, and SO_PEERGROUPS for
// the supplementary groups: the kernel's record of the peer's credentials
// when it connected, which it cannot forge). Admitted are root, the
// daemon's effective uid, and members of the socket group when one is
// configured (as effective gid or supplementary group). Anyone else is
// answered 403 with the reason, the connection is closed, and the daemon
// logs a warning naming the peer's uid and pid. The socket's mode keeps
// them out before that; the check holds even when the mode does not (a
// socket made under another policy, or chmod'ed by hand).
//
// Disk data read through the socket obeys the disk's mode for the peer, as
// the mount's default_permissions does for a read through the mount
// (guard): root reads every disk; the disk's owner needs the owner's read
// bit; a member of its group the group's; anyone else the others'. Send
// needs to read the disk and, for an incremental stream, its base; diff
// both disks. Snapshot and clone need to read their source too: the copy
// keeps the source's mode and owner, so it would not show the data to the
// peer, but it would keep it alive under a name the source's owner does
// not know of, past the source's deletion. Receive and sync read no disk
// and are open to every admitted peer. So are listing the disks, the
// store's info and a check (catalog.go): they show names, sizes, modes,
// owners and allocation, which are metadata (names, sizes and which
// blocks are allocated are not secret, even of an encrypted disk); GET
// /stats shows the names and sizes to the same peers, and a mount with
// allow_other shows all of it to every user. Defrag needs to read its
// disk: it changes no byte of it, but costs the I/O of reading and
// rewriting all of it, which only a peer that could read it may cause.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// Peer is the process at the other end of a connection to the socket, as
// the kernel recorded it when it connected.
type Peer struct {
	PID      int32
	UID, GID uint32   // effective
	Groups   []uint32 // supplementary; nil where the kernel does not tell (before Linux 4.13)
}

// inGroup reports whether gid is the peer's effective or a supplementary
// group.
func (p Peer) inGroup(gid uint32) bool {
	if p.GID == gid {
		return true
	}
	for _, g := range p.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// peerOf asks the kernel who connected c.
func peerOf(c *net.UnixConn) (Peer, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var p Peer
	var cerr error
	err = rc.Control(func(fd uintptr) {
		var uc *unix.Ucred
		if uc, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr != nil {
			cerr = fmt.Errorf("SO_PEERCRED: %w", cerr)
			return
		}
		p = Peer{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}
		p.Groups, cerr = peerGroups(int(fd))
	})
	if err == nil {
		err = cerr
	}
	return p, err
}

// peerGroups is the peer's supplementary groups (SO_PEERGROUPS), or nil
// when the kernel does not know the option.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch errno {
		case 0:
			return buf[:n/4], nil
		case unix.ERANGE: // n is the size needed
			buf = make([]uint32, n/4+1)
		case unix.ENOPROTOOPT:
			return nil, nil
		default:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		}
	}
}

// peerListener asks each connection who made it as it accepts it.
type peerListener struct{ *net.UnixListener }

func (l peerListener) Accept() (net.Conn, error) {
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	p, perr := peerOf(c)
	return &peerConn{UnixConn: c, peer: p, err: perr, rights: &rights{}}, nil
}

// peerConn is an accepted connection and who made it (or why that is not
// known), and the descriptors it passed (keys.go).
type peerConn struct {
	*net.UnixConn
	peer   Peer
	err    error
	rights *rights
}

// Read keeps the descriptors passed with the bytes (keys.go).
func (pc *peerConn) Read(b []byte) (int, error) { return pc.rights.readMsg(pc.UnixConn, b) }

// Close closes the descriptors no request took.
func (pc *peerConn) Close() error {
	pc.rights.closeAll()
	return pc.UnixConn.Close()
}

type peerKey struct{}

// peerContext is the http.Server's ConnContext: it gives the requests of
// c their peer.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	pc, ok := c.(*peerConn)
	if !ok {
		return ctx
	}
	ctx = context.WithValue(ctx, rightsKey{}, pc.rights)
	if pc.err != nil {
		return context.WithValue(ctx, peerKey{}, pc.err)
	}
	return withPeer(ctx, pc.peer)
}

func withPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// peerFrom is the peer of a request, or why it is not known.
func peerFrom(ctx context.Context) (Peer, error) {
	switch v := ctx.Value(peerKey{}).(type) {
	case Peer:
		return v, nil
	case error:
		return Peer{}, v
	}
	return Peer{}, errors.New("the connection's peer is unknown")
}

// policy is who a socket admits.
type policy struct {
	uid   uint32 // the daemon's effective uid
	group *Group // members admitted too; nil for none
}

func (a policy) admits(p Peer) bool {
	return p.UID == 0 || p.UID == a.uid || (a.group != nil && p.inGroup(a.group.GID))
}

// String names whom the socket admits, for messages.
func (a policy) String() string {
	s := "root"
	if a.uid != 0 {
		s += " and " + describeUID(a.uid)
	}
	if a.group != nil {
		s += " and members of " + a.group.String()
	}
	return s
}

// socketHandler serves the socket's requests to admitted peers: stats's,
// and ctl's through a guard for the peer.
type socketHandler struct {
	stats      http.Handler
	ctl        Controller
	policy     policy
	mountpoint string
	log        logrus.FieldLogger
}

func (s socketHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, err := peerFrom(r.Context())
	if err != nil || !s.policy.admits(p) {
		fields := logrus.Fields{"mountpoint": s.mountpoint, "method": r.Method, "path": r.URL.Path}
		var who string
		if err != nil {
			fields["error"] = err.Error()
			who = "a peer the kernel did not name (" + err.Error() + ")"
		} else {
			fields["uid"], fields["gid"], fields["pid"] = p.UID, p.GID, p.PID
			who = fmt.Sprintf("%s (pid %d)", describeUID(p.UID), p.PID)
		}
		s.log.WithFields(fields).Warn("refused a connection to the control socket")
		w.Header().Set("Connection", "close")
		http.Error(w, fmt.Sprintf("permission denied: the socket of %s admits only %s; %s is refused", s.mountpoint, s.policy, who), http.StatusForbidden)
		return
	}
	withControl(s.stats, guard{Controller: s.ctl, peer: p}).ServeHTTP(w, r)
}

// guard is a Controller for one peer: it refuses to read a disk the peer
// may not read (the top of this file), and gives a disk a peer receives
// to that peer unless the peer is root (Receive). The requests that read
// no disk's data (Sync, Stat, List, Info, Version, Check) go through to the
// embedded Controller as they are.
type guard struct {
	Controller
	peer Peer
}

// mayRead reports whether p may read a disk with d's mode and owners, as
// the kernel's default_permissions check decides.
func mayRead(p Peer, d image.DiskInfo) bool {
	return permits(p, d.Mode, d.UID, d.GID, 0o4)
}

// permits reports whether p has the permission bit want (0o4 read, 0o2
// write, 0o1 search) on a file with mode, uid and gid, as the kernel
// decides for a directory or a file without execute bits: root has them
// all.
func permits(p Peer, mode, uid, gid uint32, want uint32) bool {
	switch {
	case p.UID == 0:
		return true
	case p.UID == uid:
		return mode&(want<<6) != 0
	case p.inGroup(gid):
		return mode&(want<<3) != 0
	}
	return mode&want != 0
}

// readable returns an error matching fs.ErrPermission when the peer may
// not read the disk name, or Stat's error.
func (g guard) readable(name string) error { return g.mayAccess(name, 0o4, "read") }

// mayAccess returns an error matching fs.ErrPermission when the peer has
// not the permission bit want (verb, for the message) on the disk name,
// or Stat's error.
func (g guard) mayAccess(name string, want uint32, verb string) error {
	info, err := g.Controller.Stat(name)
	if err != nil {
		return err
	}
	if !permits(g.peer, info.Mode, info.UID, info.GID, want) {
		return fmt.Errorf("%w: %s may not %s disk %q (mode %04o, %s, %s)", fs.ErrPermission,
			describeUID(g.peer.UID), verb, name, info.Mode&0o7777, describeUID(info.UID), describeGID(info.GID))
	}
	return nil
}

func (g guard) Snapshot(disk, name string) (image.DiskInfo, error) {
	if err := g.readable(disk); err != nil {
		return image.DiskInfo{}, err
	}
	return g.Controller.Snapshot(disk, name)
}

func (g guard) Clone(disk, name string) (image.DiskInfo, error) {
	if err := g.readable(disk); err != nil {
		return image.DiskInfo{}, err
	}
	return g.Controller.Clone(disk, name)
}

func (g guard) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
	for _, name := range []string{old, new} {
		if err := g.readable(name); err != nil {
			return nil, image.DiffStats{}, err
		}
	}
	return g.Controller.Diff(old, new)
}

func (g guard) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	if err := g.readable(disk); err != nil {
		return transfer.Stats{}, err
	}
	if from != "" {
		if err := g.readable(from); err != nil {
			return transfer.Stats{}, err
		}
	}
	return g.Controller.Send(w, disk, from)
}

// Receive makes the received disk the peer's, as a file a user creates is
// that user's: only root keeps the stream's owner or names another (no
// one else may give a disk away, as chown(2) allows only root). A peer
// other than root naming another owner is refused.
func (g guard) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	if g.peer.UID != 0 {
		if o.UID != nil && *o.UID != g.peer.UID || o.GID != nil && *o.GID != g.peer.GID && !g.peer.inGroup(*o.GID) {
			return transfer.Stats{}, fmt.Errorf("%w: %s may not receive a disk owned by another user or group (only root may)",
				fs.ErrPermission, describeUID(g.peer.UID))
		}
		uid, gid := g.peer.UID, g.peer.GID
		if o.GID != nil {
			gid = *o.GID // a group of the peer's own
		}
		o.UID, o.GID = &uid, &gid
	}
	return g.Controller.Receive(r, name, o)
}

func (g guard) Defrag(name string) (image.DefragResult, error) {
	if err := g.readable(name); err != nil {
		return image.DefragResult{}, err
	}
	return g.Controller.Defrag(name)
}

var _ Controller = guard{}
