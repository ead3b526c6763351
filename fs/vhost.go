package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/door/blkdisk"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// The vhost-user door: disks served to virtual machines on Unix sockets.
//
// Any disk of the mount may be served as a vhost-user-blk device on a
// socket (Server.ServeVhostUser, `vdisk vhost-user MNT/NAME SOCKET`) until
// Server.StopVhostUser, on one socket at a time (a second socket for a
// served disk is refused). With Options.VhostUserDir every disk is served as
// DIR/NAME.sock ("auto" servers): the disks there at mount time, and each
// disk made later through the mount or its daemon (create, mknod,
// snapshot, clone, receive). A rename moves an auto server: the server on
// the old socket is closed and one on the new socket started, so a
// frontend connected on the old path loses the device. A disk's servers,
// auto or not, are closed before it is removed, and all of them when
// serving ends, before the store can close. A locked encrypted disk is
// not served; an unlock through the mount (Server.Unlock) serves it.
//
// A server holds its own handle of the disk (image.Disk), as an open of
// the disk's file does: the disk is the same disk through both doors, and
// a resize through the file (truncate, vdisk resize) is told to the
// frontend (blk.Server.ConfigChanged). Flush on the door is fsync of the
// file: the disk adapter's Flush, image.Disk.Sync.
//
// Locking: vhostSet.mu protects its maps and is held across a server's
// start and close, so that a disk's removal, rename or resize and a
// request of the control socket see a server either fully there or gone.
// It is never taken with vfs.mu held, nor vfs.mu with it. StopVhostUser's
// check (may) runs with it held, so that the server it allowed is the one
// closed; the control socket's check reads the store only (Store.Stat).

// VhostServer is one disk's vhost-user-blk device, as the mount drives it
// (*blk.Server).
type VhostServer interface {
	ConfigChanged()
	Close() error
	Stats() blk.Stats
}

// VhostServe starts a vhost-user-blk device for the open disk h on
// cfg.Socket and returns once the socket listens. The server uses h until
// it is closed; the caller closes h after that. The mount's own is
// blk.Serve on the disk adapter (serveBlk).
type VhostServe func(h *image.Disk, cfg blk.Config) (VhostServer, error)

// serveBlk is the mount's VhostServe: package vhostuser/blk's device on
// door/blkdisk's view of a disk of store.
func serveBlk(store *image.Store) VhostServe {
	return func(h *image.Disk, cfg blk.Config) (VhostServer, error) {
		return blk.Serve(blkdisk.New(store, h), cfg)
	}
}

// VhostUser describes one served disk.
type VhostUser struct {
	Disk   string    `json:"disk"`
	DiskID uint64    `json:"disk_id"`
	Socket string    `json:"socket"`
	Auto   bool      `json:"auto"` // served because of Options.VhostUserDir
	Since  time.Time `json:"since"`
	Stats  blk.Stats `json:"stats"`
}

// Errors of the vhost-user door.
var (
	// ErrNotServed: no disk of this mount is served on that socket.
	ErrNotServed = fmt.Errorf("fs: no disk of this mount is served on that socket: %w", image.ErrNotExist)
)

// servedDisk is one running server.
type servedDisk struct {
	id     uint64
	name   string
	socket string
	auto   bool
	since  time.Time
	h      *image.Disk
	srv    VhostServer
}

// vhostSet is the mount's servers.
type vhostSet struct {
	store  *image.Store
	log    logrus.FieldLogger
	serve  VhostServe
	dir    string // Options.VhostUserDir, absolute; "" for none
	queues int
	group  int // blk.Config.SocketGroup
	mu     struct {
		sync.Mutex
		bySocket map[string]*servedDisk
		closed   bool // serving ended: no server starts any more
	}
}

func newVhostSet(store *image.Store, lg logrus.FieldLogger, opts Options) *vhostSet {
	s := &vhostSet{store: store, log: lg, serve: opts.VhostServe, queues: opts.VhostUserQueues, group: -1}
	if s.serve == nil {
		s.serve = serveBlk(store)
	}
	if opts.VhostUserDir != "" {
		s.dir, _ = filepath.Abs(opts.VhostUserDir)
	}
	if opts.VhostUserGroup != nil {
		s.group = *opts.VhostUserGroup
	}
	s.mu.bySocket = make(map[string]*servedDisk)
	return s
}

// autoSocket is where an auto server of the disk name listens.
func (s *vhostSet) autoSocket(name string) string { return filepath.Join(s.dir, name+".sock") }

// start serves the disk called name on socket.
func (s *vhostSet) start(name, socket string, auto bool) (VhostUser, error) {
	socket, err := filepath.Abs(socket)
	if err != nil {
		return VhostUser{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(name, socket, auto)
}

func (s *vhostSet) startLocked(name, socket string, auto bool) (VhostUser, error) {
	if s.mu.closed {
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: the mount is going away", name, socket)
	}
	if d := s.mu.bySocket[socket]; d != nil {
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: disk %q is served there already: %w", name, socket, d.name, image.ErrExist)
	}
	h, err := s.store.OpenDisk(name)
	if err != nil {
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: %w", name, socket, err)
	}
	if _, locked := h.Encrypted(); locked { // as an open of its file is refused
		h.Close()
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: %w", name, socket, image.ErrLocked)
	}
	// One frontend per disk: a disk served on one socket is not served on
	// another, so two guests never write it at once through this door.
	if ds := s.ofDiskLocked(h.ID()); len(ds) > 0 {
		h.Close()
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: it is served on %s already (stop that first): %w", name, socket, ds[0].socket, image.ErrExist)
	}
	srv, err := s.serve(h, blk.Config{Socket: socket, ID: name, Queues: s.queues, SocketGroup: s.group,
		Log: s.log.WithFields(logrus.Fields{"disk": name, "vhost_user_socket": socket})})
	if err != nil {
		h.Close()
		return VhostUser{}, fmt.Errorf("serve disk %q on %s: %w", name, socket, err)
	}
	d := &servedDisk{id: h.ID(), name: name, socket: socket, auto: auto, since: time.Now(), h: h, srv: srv}
	s.mu.bySocket[socket] = d
	s.log.WithFields(logrus.Fields{"disk": name, "vhost_user_socket": socket, "auto": auto}).Info("serving the disk on vhost-user")
	return d.info(), nil
}

func (d *servedDisk) info() VhostUser {
	return VhostUser{Disk: d.name, DiskID: d.id, Socket: d.socket, Auto: d.auto, Since: d.since, Stats: d.srv.Stats()}
}

// stopLocked closes d's server, then its handle.
func (s *vhostSet) stopLocked(d *servedDisk, why string) error {
	delete(s.mu.bySocket, d.socket)
	err := d.srv.Close()
	if cerr := d.h.Close(); err == nil {
		err = cerr
	}
	fields := logrus.Fields{"disk": d.name, "vhost_user_socket": d.socket, "why": why}
	if err != nil {
		s.log.WithFields(fields).WithError(err).Warn("stopped serving the disk on vhost-user, with an error")
		return fmt.Errorf("stop serving disk %q on %s: %w", d.name, d.socket, err)
	}
	s.log.WithFields(fields).Info("stopped serving the disk on vhost-user")
	return nil
}

// stop closes the server on socket if may (nil: always) allows it, asked
// about that server under s.mu, so that the server it allowed is the one
// closed.
func (s *vhostSet) stop(socket string, may func(VhostUser) error) error {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.mu.bySocket[abs]
	if d == nil {
		return fmt.Errorf("%s: %w", socket, ErrNotServed)
	}
	if may != nil {
		if err := may(d.info()); err != nil {
			return err
		}
	}
	return s.stopLocked(d, "asked")
}

// list describes every server, by socket.
func (s *vhostSet) list() []VhostUser {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VhostUser, 0, len(s.mu.bySocket))
	for _, d := range s.mu.bySocket {
		out = append(out, d.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Socket < out[j].Socket })
	return out
}

// serveAll starts an auto server for every disk of the store (at mount
// time); a disk that cannot be served is logged and left.
func (s *vhostSet) serveAll() error {
	if s.dir == "" {
		return nil
	}
	if fi, err := os.Stat(s.dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("vhost-user directory %s: not a directory (%v)", s.dir, err)
	}
	for _, info := range s.store.List() {
		if !info.Locked { // served once unlocked (unlocked)
			s.created(info.Name)
		}
	}
	return nil
}

// created starts the auto server of a disk just made.
func (s *vhostSet) created(name string) {
	if s.dir == "" {
		return
	}
	if _, err := s.start(name, s.autoSocket(name), true); err != nil {
		s.log.WithError(err).WithField("disk", name).Error("the disk is not served on vhost-user")
	}
}

// unlocked starts the auto servers of the disks that are unlocked now and
// not served (they were locked when the mount or their creation tried).
func (s *vhostSet) unlocked() {
	if s.dir == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, info := range s.store.List() {
		if info.Locked || len(s.ofDiskLocked(info.ID)) > 0 {
			continue
		}
		if _, err := s.startLocked(info.Name, s.autoSocket(info.Name), true); err != nil {
			s.log.WithError(err).WithField("disk", info.Name).Error("the unlocked disk is not served on vhost-user")
		}
	}
}

// ofDiskLocked lists the servers of the disk id.
func (s *vhostSet) ofDiskLocked(id uint64) []*servedDisk {
	var out []*servedDisk
	for _, d := range s.mu.bySocket {
		if d.id == id {
			out = append(out, d)
		}
	}
	return out
}

// removing closes every server of the disk id before it is removed.
func (s *vhostSet) removing(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.ofDiskLocked(id) {
		s.stopLocked(d, "the disk is removed")
	}
}

// renamed moves the auto server of the disk id, now called newName, to
// its new socket, and renames the disk in the others.
func (s *vhostSet) renamed(id uint64, newName string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.ofDiskLocked(id) {
		if !d.auto {
			d.name = newName
			continue
		}
		s.stopLocked(d, "the disk is renamed to "+newName)
		if _, err := s.startLocked(newName, s.autoSocket(newName), true); err != nil {
			s.log.WithError(err).WithField("disk", newName).Error("the renamed disk is not served on vhost-user")
		}
	}
}

// resized tells the frontends of the disk id that its size changed.
func (s *vhostSet) resized(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.ofDiskLocked(id) {
		d.srv.ConfigChanged()
	}
}

// closeAll closes every server; no server starts afterwards.
func (s *vhostSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.closed = true
	for _, d := range s.mu.bySocket {
		s.stopLocked(d, "serving ends")
	}
}

// ServeVhostUser serves the disk called disk as a vhost-user-blk device on
// socket (made absolute) and returns once the socket listens. The device
// shares the disk with its file in the mount; StopVhostUser, the disk's
// removal or the end of serving closes it.
func (s *Server) ServeVhostUser(disk, socket string) (VhostUser, error) {
	return s.vfs.vhost.start(disk, socket, false)
}

// StopVhostUser closes the server on socket (ErrNotServed if none): the
// frontend is disconnected, the socket removed, and every request in
// flight ended. When may is not nil it is asked first, about the server on
// socket, and its error refuses the stop; it is asked with the set of
// servers locked, so it must not call back into the vhost-user door, and
// no server can take the socket over between the question and the stop.
func (s *Server) StopVhostUser(socket string, may func(VhostUser) error) error {
	return s.vfs.vhost.stop(socket, may)
}

// VhostUsers describes every disk served on vhost-user, by socket.
func (s *Server) VhostUsers() []VhostUser { return s.vfs.vhost.list() }
