package telemetry

// How a client reaches a mount's socket, and what it says when it may not.

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// findSocket is the socket of the mount at mountpoint (absolute): where a
// daemon of this user puts it (SocketPath) when there is one there. Else,
// for a mount whose daemon runs as another user (mountOwner), where that
// user's daemon puts it: root's runtime directory, or the runtime
// directories another user's daemon may use; the first name that exists,
// or that this user may not look up, is taken. For a mount point whose
// owner is not known (not a FUSE mount this process can see), root's
// socket is taken if it is there for this user to see. Otherwise it is
// SocketPath.
func findSocket(mountpoint string) string {
	own := SocketPath(mountpoint)
	if _, err := os.Lstat(own); !errors.Is(err, fs.ErrNotExist) {
		return own
	}
	root := filepath.Join(rootRuntimeDir, socketName(mountpoint))
	uid, ok := mountOwner(mountpoint)
	switch {
	case !ok:
		if _, err := os.Lstat(root); err == nil {
			return root
		}
		return own
	case uid == uint32(os.Geteuid()):
		return own
	}
	socks := []string{root}
	if uid != 0 {
		socks = []string{
			filepath.Join(fmt.Sprintf("/run/user/%d/vdiskfs", uid), socketName(mountpoint)),
			filepath.Join(os.TempDir(), fmt.Sprintf("vdiskfs-%d", uid), socketName(mountpoint)),
		}
	}
	for _, sock := range socks {
		if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
			return sock
		}
	}
	return own
}

// mountOwner is the uid of the daemon of the FUSE mount at mountpoint
// (its user_id= option in /proc/self/mountinfo); ok is false when nothing
// is mounted there, or not by FUSE.
func mountOwner(mountpoint string) (uid uint32, ok bool) {
	canon := mountpoint
	if dir, err := filepath.EvalSymlinks(filepath.Dir(mountpoint)); err == nil {
		canon = filepath.Join(dir, filepath.Base(mountpoint))
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - TYPE SOURCE SUPEROPTIONS
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !found || len(f) < 5 || len(g) < 3 || unescapeMountinfo(f[4]) != canon || !strings.HasPrefix(g[0], "fuse") {
			continue
		}
		ok = false // the last mount at a point is the one seen there
		for _, o := range strings.Split(g[2], ",") {
			if v, isUID := strings.CutPrefix(o, "user_id="); isUID {
				if n, err := strconv.ParseUint(v, 10, 32); err == nil {
					uid, ok = uint32(n), true
				}
			}
		}
	}
	return uid, ok
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space)
// in a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// expectContinue sends a request's body only once the daemon asks for it
// (Expect: 100-continue), so that a refusal (a peer the socket does not
// admit) comes back as the daemon's answer, not as a broken pipe while
// the body is still going out.
type expectContinue struct{ t http.RoundTripper }

func (e expectContinue) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r = r.Clone(r.Context())
		r.Header.Set("Expect", "100-continue")
	}
	return e.t.RoundTrip(r)
}

// mayConnect returns an error matching fs.ErrPermission, which says whom
// the socket admits, when this process may not connect to sock, the
// socket of the mount at mountpoint. Anything else is left for the
// connection to find.
func mayConnect(mountpoint, sock string) error {
	err := unix.Faccessat(unix.AT_FDCWD, sock, unix.W_OK, unix.AT_EACCESS)
	if !errors.Is(err, unix.EACCES) {
		return nil
	}
	who := "root"
	var st unix.Stat_t
	if unix.Lstat(sock, &st) == nil {
		if st.Uid != 0 {
			who += " and " + describeUID(st.Uid)
		}
		if st.Mode&0o060 != 0 {
			who += " and members of " + describeGID(st.Gid)
		}
	} else if unix.Stat(filepath.Dir(sock), &st) == nil && st.Uid != 0 {
		who += " and " + describeUID(st.Uid)
	}
	return fmt.Errorf("%w: the socket of %s (%s) admits only %s; you are %s", fs.ErrPermission,
		mountpoint, sock, who, describeUID(uint32(os.Geteuid())))
}
