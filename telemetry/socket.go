package telemetry

// The control socket's place and mode.
//
// The sockets of one user's mounts live in one runtime directory
// (runtimeDir): /run/vdiskfs for root, else $XDG_RUNTIME_DIR/vdiskfs, else
// /tmp/vdiskfs-UID. The daemon creates it 0700 and, before every use,
// opens it without following a symbolic link and checks that it is a
// directory owned by the daemon's effective uid that neither its group nor
// others may write in (prepareDir); anything else is refused, naming the
// directory and what is wrong, since whoever can write there can put their
// own socket in place of the mount's. Its parent must not let others rename
// it away either: owned by root or the daemon's uid, and writable by group
// or others only with the sticky bit (/tmp).
//
// The directory's mode is 0700, or 0711 once a mount of this user serves a
// socket group (--socket-group): the group needs search permission to reach
// its socket. The directory is shared by all the user's mounts, and each
// may name a different group, so the search bit is given to others rather
// than the directory given to one group; it lets nobody list the directory
// (its names are hashes of mount points, which /proc/mounts shows anyway),
// and each socket's own mode and the peer check decide who may connect.
// Read bits for group and others (left by an older vdiskfs, which made the
// directory 0755) are taken away; since neither could ever write there,
// everything in it is the daemon user's.
//
// A client looks for the socket in its own runtime directory, then in the
// runtime directory of the user the kernel names as the mount's owner
// (findSocket): the members of a root daemon's socket group find its
// socket in /run/vdiskfs. A non-root daemon's directory under
// $XDG_RUNTIME_DIR is usually closed to other users, so --socket-group is
// mostly for daemons run as root (fstab, systemd).
//
// A socket is bound in a fresh 0700 directory inside the runtime
// directory, given its mode (0600, or 0660 and the socket group) and only
// then renamed to its name (listenSocket): no umask can widen it and no one
// can connect to it in between. The rename also replaces, atomically, a
// socket left by a killed daemon.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Group is the group whose members may use a mount's socket besides root
// and the daemon's user (vdisk mount --socket-group).
type Group struct {
	GID  uint32
	Name string // for messages; the number when the group has no name
}

func (g Group) String() string {
	if g.Name == "" || g.Name == strconv.FormatUint(uint64(g.GID), 10) {
		return fmt.Sprintf("gid %d", g.GID)
	}
	return fmt.Sprintf("group %s (gid %d)", g.Name, g.GID)
}

// LookupGroup finds the group named s, or numbered s (a number need not
// name a group in the group database, as in a container).
func LookupGroup(s string) (Group, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		if g, err := user.LookupGroupId(s); err == nil {
			return Group{GID: uint32(n), Name: g.Name}, nil
		}
		return Group{GID: uint32(n), Name: s}, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return Group{}, fmt.Errorf("socket group %q: %w", s, err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return Group{}, fmt.Errorf("socket group %q: gid %q: %w", s, g.Gid, err)
	}
	return Group{GID: uint32(n), Name: g.Name}, nil
}

// rootRuntimeDir is the runtime directory of root's mounts.
const rootRuntimeDir = "/run/vdiskfs"

// runtimeDir is the directory of the sockets of this user's mounts.
func runtimeDir() string {
	if os.Geteuid() == 0 {
		return rootRuntimeDir
	}
	if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
		return filepath.Join(rt, "vdiskfs")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("vdiskfs-%d", os.Geteuid()))
}

// prepareDir makes dir, the runtime directory, if missing, and checks it
// (see the top of this file); it gives others search permission when
// search is true. euid is the daemon's effective uid.
func prepareDir(dir string, euid uint32, search bool) error {
	if err := checkParent(filepath.Dir(dir), euid); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		if fi, lerr := os.Lstat(dir); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("socket directory %s is a symbolic link; it must be a directory of the daemon's own: remove it", dir)
		}
		return fmt.Errorf("socket directory %s is not a directory: remove it", dir)
	}
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	perm := st.Mode & 0o7777
	switch {
	case st.Uid != euid:
		return fmt.Errorf("socket directory %s belongs to %s, not to the daemon's %s: another user made it, and could replace the mount's socket; remove it",
			dir, describeUID(st.Uid), describeUID(euid))
	case perm&0o022 != 0:
		return fmt.Errorf("socket directory %s has mode %04o: group or others may write in it, and could replace the mount's socket; remove it (the daemon makes it 0700)",
			dir, perm)
	}
	want := 0o700 | perm&0o011
	if search {
		want |= 0o011
	}
	if perm != want {
		if err := unix.Fchmod(fd, want); err != nil {
			return fmt.Errorf("socket directory %s: mode %04o to %04o: %w", dir, perm, want, err)
		}
	}
	return nil
}

// checkParent refuses a parent of the runtime directory from which
// someone else could rename it away and put their own in its place.
func checkParent(parent string, euid uint32) error {
	var st unix.Stat_t
	if err := unix.Stat(parent, &st); err != nil {
		return fmt.Errorf("socket directory's parent %s: %w", parent, err)
	}
	if st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("socket directory's parent %s belongs to %s, neither root nor the daemon's %s", parent, describeUID(st.Uid), describeUID(euid))
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("socket directory's parent %s has mode %04o: group or others may write in it without the sticky bit", parent, st.Mode&0o7777)
	}
	return nil
}

// listenSocket binds the Unix socket dir/name with mode 0600, or 0660 and
// group's ownership when group is not nil, whatever the umask: it binds in
// a new 0700 directory inside dir, sets the mode, and renames the socket
// into place (replacing one a killed daemon left). The listener does not
// unlink the socket when closed.
func listenSocket(dir, name string, group *Group) (*net.UnixListener, error) {
	stage, err := os.MkdirTemp(dir, ".bind-")
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	defer os.RemoveAll(stage)
	tmp := filepath.Join(stage, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	if group != nil {
		mode = 0o660
		if err := os.Lchown(tmp, -1, int(group.GID)); err != nil {
			l.Close()
			return nil, fmt.Errorf("socket: give it to %s (a daemon not run as root can give it only to a group it is a member of): %w", group, err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	return l, nil
}

// describeUID is "uid N (NAME)", or "uid N" when N has no name.
func describeUID(uid uint32) string {
	s := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(s); err == nil && u.Username != "" {
		return fmt.Sprintf("uid %s (%s)", s, u.Username)
	}
	return "uid " + s
}

// describeGID is "group NAME (gid N)", or "gid N".
func describeGID(gid uint32) string {
	s := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(s); err == nil && g.Name != "" {
		return fmt.Sprintf("group %s (gid %s)", g.Name, s)
	}
	return "gid " + s
}
