package telemetry

// The vhost-user door through the control socket (`vdisk vhost-user`,
// `vdisk ls`, `vdisk stats`):
//
//	GET    /vhost-user              200, []VhostUser sorted by socket
//	POST   /vhost-user              a VhostUserRequest: 201 and the VhostUser
//	                                once the socket listens
//	DELETE /vhost-user?socket=PATH  204 once the server is closed; 404 when
//	                                this mount serves nothing there
//
// A frontend on a served disk's socket reads and writes the disk, so
// serving it is a write (guard.ServeVhostUser): the peer must be allowed to
// write the disk, as its mode and owners say for an open for writing
// through the mount. The daemon, often root, then creates the socket where
// the peer said: the peer must be allowed to create a file in that
// directory (write and search permission on it), or the socket would be a
// way to put a file where the peer may not. Stopping a server needs write
// permission on the disk it serves. Listing is open to every admitted
// peer, as the list of disks is: it names disks and sockets.
//
// A mount whose Controller does not serve vhost-user (no VhostController)
// answers these requests 404.

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// VhostUser describes one disk served on vhost-user.
type VhostUser struct {
	Disk   string    `json:"disk"`
	Socket string    `json:"socket"`
	Auto   bool      `json:"auto"` // served by vdisk mount --vhost-user-dir
	Since  time.Time `json:"since"`
	Stats  blk.Stats `json:"stats"`
}

// VhostUserRequest is the body of POST /vhost-user.
type VhostUserRequest struct {
	Disk   string `json:"disk"`
	Socket string `json:"socket"` // absolute
}

// VhostController is what a mount that serves vhost-user adds to its
// Controller; VhostSource what it adds to its Source (the served disks'
// counters in GET /stats and /metrics).
type VhostController interface {
	VhostSource
	// ServeVhostUser serves the disk called disk on socket, returning
	// once the socket listens.
	ServeVhostUser(disk, socket string) (VhostUser, error)
	// StopVhostUser closes the server on socket, an error matching
	// image.ErrNotExist when there is none, unless may, given that
	// server, refuses: may is asked and the server closed under one lock,
	// so the server may allowed is the one closed.
	StopVhostUser(socket string, may func(VhostUser) error) error
}

// VhostSource lists the disks served on vhost-user, sorted by socket.
type VhostSource interface {
	VhostUsers() []VhostUser
}

// ErrNoVhostUser: the mount does not serve vhost-user.
var ErrNoVhostUser = fmt.Errorf("this mount does not serve vhost-user: %w", image.ErrNotExist)

func handleVhostUser(mux *http.ServeMux, g guard) {
	mux.HandleFunc("GET /vhost-user", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, g.VhostUsers())
	})
	mux.HandleFunc("POST /vhost-user", func(w http.ResponseWriter, r *http.Request) {
		var req VhostUserRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
			http.Error(w, "vhost-user request: "+err.Error(), http.StatusBadRequest)
			return
		}
		u, err := g.ServeVhostUser(req.Disk, req.Socket)
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		writeJSON(w, http.StatusCreated, u)
	})
	mux.HandleFunc("DELETE /vhost-user", func(w http.ResponseWriter, r *http.Request) {
		if err := g.StopVhostUser(r.URL.Query().Get("socket")); err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// vhost is the Controller's vhost-user side, or nil.
func (g guard) vhost() VhostController {
	vc, _ := g.Controller.(VhostController)
	return vc
}

// VhostUsers lists the served disks (none when the mount serves none).
func (g guard) VhostUsers() []VhostUser {
	if vc := g.vhost(); vc != nil {
		return vc.VhostUsers()
	}
	return []VhostUser{}
}

// ServeVhostUser serves a disk the peer may write on a socket it may
// create (the top of this file).
func (g guard) ServeVhostUser(disk, socket string) (VhostUser, error) {
	vc := g.vhost()
	if vc == nil {
		return VhostUser{}, ErrNoVhostUser
	}
	if !filepath.IsAbs(socket) {
		return VhostUser{}, fmt.Errorf("%w: the socket %q is not an absolute path", image.ErrInvalidName, socket)
	}
	if err := g.writable(disk); err != nil {
		return VhostUser{}, err
	}
	if err := g.mayCreateIn(filepath.Dir(socket)); err != nil {
		return VhostUser{}, err
	}
	return vc.ServeVhostUser(disk, socket)
}

// StopVhostUser stops a server of a disk the peer may write.
func (g guard) StopVhostUser(socket string) error {
	vc := g.vhost()
	if vc == nil {
		return ErrNoVhostUser
	}
	return vc.StopVhostUser(socket, func(u VhostUser) error { return g.writable(u.Disk) })
}

// writable returns an error matching fs.ErrPermission when the peer may
// not write the disk name, or Stat's error.
func (g guard) writable(name string) error { return g.mayAccess(name, 0o2, "write") }

// mayCreateIn returns an error matching fs.ErrPermission unless the peer
// may create a file in dir: write and search permission on it.
func (g guard) mayCreateIn(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%w: socket directory %s is not a directory", image.ErrInvalidName, dir)
	}
	if !permits(g.peer, st.Mode, st.Uid, st.Gid, 0o2) || !permits(g.peer, st.Mode, st.Uid, st.Gid, 0o1) {
		return fmt.Errorf("%w: %s may not create a socket in %s (mode %04o, %s, %s)", fs.ErrPermission,
			describeUID(g.peer.UID), dir, st.Mode&0o7777, describeUID(st.Uid), describeGID(st.Gid))
	}
	return nil
}

// ServeVhostUser asks the mount at mountpoint to serve its disk called
// disk on socket (made absolute), and returns once the socket listens.
func ServeVhostUser(mountpoint, disk, socket string) (VhostUser, error) {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return VhostUser{}, err
	}
	body, err := json.Marshal(VhostUserRequest{Disk: disk, Socket: abs})
	if err != nil {
		return VhostUser{}, err
	}
	var u VhostUser
	err = doJSON(mountpoint, http.MethodPost, "vhost-user", body, http.StatusCreated, 0, &u)
	return u, err
}

// StopVhostUser asks the mount at mountpoint to stop serving on socket
// (made absolute); an error matching image.ErrNotExist when it serves
// nothing there.
func StopVhostUser(mountpoint, socket string) error {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return err
	}
	return doJSON(mountpoint, http.MethodDelete, "vhost-user?socket="+url.QueryEscape(abs), nil, http.StatusNoContent, 0, nil)
}

// VhostUsers lists the disks the mount at mountpoint serves on vhost-user.
func VhostUsers(mountpoint string) ([]VhostUser, error) {
	var us []VhostUser
	err := getJSON(mountpoint, http.MethodGet, "vhost-user", 30*time.Second, &us)
	return us, err
}
