package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/fs"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// mountFlags are the options of vdisk mount.
type mountFlags struct {
	allowOther     bool
	debug          bool
	foreground     bool
	readyFD        int
	logFile        string
	defaultSize    sizeValue
	commitInterval time.Duration
	ioEngine       string
	fuseTransport  string
	metricsAddr    string
	socketGroup    string // members may use the control socket too
	keyDir         string // DIR/NAME.key unlocks disk NAME (keys.go)
	breakLock      bool
	vhostUserDir   string   // serve every disk as DIR/NAME.sock
	options        []string // -o, mount(8)-style (mountopts.go)
}

// mountSource gives telemetry the store's metrics and the FUSE layer's.
type mountSource struct {
	s   *image.Store
	srv *fs.Server
	log logrus.FieldLogger
}

func (m mountSource) Metrics() image.Metrics                        { return m.s.Metrics() }
func (m mountSource) OpMetrics() map[string]image.HistogramSnapshot { return m.srv.OpMetrics() }

// Stat describes a disk: the socket checks its mode before a peer reads
// it.
func (m mountSource) Stat(name string) (image.DiskInfo, error) { return m.s.Stat(name) }

// Sync is `vdisk sync MOUNTPOINT`: the full commit an fsync makes.
func (m mountSource) Sync() error { return m.s.Commit() }

// Snapshot is `vdisk snapshot MOUNTPOINT/DISK NAME`: durable, and shown in
// the mount, when it returns.
func (m mountSource) Snapshot(disk, name string) (image.DiskInfo, error) {
	return m.srv.Snapshot(disk, name)
}

// Clone is `vdisk clone MOUNTPOINT/DISK NAME`, shown in the mount when it
// returns.
func (m mountSource) Clone(disk, name string) (image.DiskInfo, error) {
	return m.srv.Clone(disk, name)
}

// Diff, Send and Receive are `vdisk diff`, `send` and `receive` given a
// mounted disk (fs.Server's).
func (m mountSource) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
	return m.srv.Diff(old, new)
}

func (m mountSource) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	return m.srv.Send(w, disk, from)
}

func (m mountSource) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	if o.Key != nil {
		holdKeys(m.log) // keys.go
	}
	return m.srv.Receive(r, name, o)
}

// List, Info, Version and Check are `vdisk ls`, `info` and `fsck` given
// the mount point or the store of a mount. Check runs on the live store:
// it stops writers while it runs (image.Store.Check).
func (m mountSource) List() []image.DiskInfo { return m.s.List() }
func (m mountSource) Info() image.Info       { return m.s.Info() }
func (m mountSource) Version() int           { return m.s.Version() }
func (m mountSource) Check() *image.Report   { return m.s.Check() }

// ServeVhostUser, StopVhostUser and VhostUsers are `vdisk
// vhost-user` and the served disks of `vdisk ls` and `stats`
// (fs.Server's).
func (m mountSource) ServeVhostUser(disk, socket string) (telemetry.VhostUser, error) {
	u, err := m.srv.ServeVhostUser(disk, socket)
	return vhostUserOf(u), err
}

func (m mountSource) StopVhostUser(socket string, may func(telemetry.VhostUser) error) error {
	return m.srv.StopVhostUser(socket, func(u fs.VhostUser) error { return may(vhostUserOf(u)) })
}

func (m mountSource) VhostUsers() []telemetry.VhostUser {
	us := m.srv.VhostUsers()
	out := make([]telemetry.VhostUser, len(us))
	for i, u := range us {
		out[i] = vhostUserOf(u)
	}
	return out
}

func vhostUserOf(u fs.VhostUser) telemetry.VhostUser {
	return telemetry.VhostUser{Disk: u.Disk, Socket: u.Socket, Auto: u.Auto, Since: u.Since, Stats: u.Stats}
}

// Defrag is `vdisk defrag` given the mount point or the store of a mount.
// It moves blocks under the disk's range lock and changes no byte, so the
// kernel's caches stay right.
func (m mountSource) Defrag(name string) (image.DefragResult, error) { return m.s.Defrag(name, nil) }

func newMountCmd(e *env) *cobra.Command {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount [STORE] MOUNTPOINT",
		Short: "Mount a store: each disk becomes a raw image file",
		Long: `Mount a store at MOUNTPOINT (created if missing). Every disk of the store is a
file MOUNTPOINT/NAME that hypervisors open as a raw image; a new file is a new
disk.

Without STORE, the default store is used: $XDG_DATA_HOME/vdiskfs/default.store
(~/.local/share/vdiskfs/default.store), created and formatted on first use as a
sparse file (--default-size, else 64 GiB or three quarters of the free space
there, whichever is smaller).

Like other FUSE file systems, vdisk mount goes to the background once the
mount is ready, so when it returns the mount can be used; its log goes to
--log-file. With --foreground it stays attached, logging to stderr, and
--ready-fd N writes "ready" to file descriptor N when the mount is usable (it
also tells systemd through $NOTIFY_SOCKET). "vdisk stats MOUNTPOINT" shows the
mount's I/O figures; --metrics ADDR also serves them to Prometheus. SIGINT or
SIGTERM, or an unmount (vdisk umount, umount, fusermount -u), commit everything
and close the store cleanly; "vdisk umount" returns only once that is done. A
store can be mounted once at a time. When the store is still held by a daemon
that was unmounted a moment ago and is closing it, vdisk mount waits for it
(30 s at most).

--vhost-user-dir DIR serves every disk as a vhost-user-blk device on the
Unix socket DIR/NAME.sock as well (see vdisk vhost-user): the disks there at
mount time and each disk made later, moved by a rename, closed before the
disk is removed and at unmount. DIR must exist. The sockets are the daemon
user's, 0600, or 0660 and --socket-group's group.

vdisk stats, sync, snapshot, clone, diff, send and receive reach a mount
through its control socket, which admits only root and the user the daemon
runs as; --socket-group GROUP admits the members of GROUP too (the socket is
then 0660 and GROUP's). Disks read through it (send, diff, and the source of
a snapshot or clone) must be readable by the caller, as through the mount.

-o takes mount(8)-style options, as /etc/fstab passes them through
mount.fuse3 ("mount -t fuse.vdisk STORE MOUNTPOINT -o OPTIONS" runs
"vdisk STORE MOUNTPOINT -o OPTIONS"): allow_other, debug,
commit_interval=DURATION, metrics=ADDR, socket_group=GROUP,
vhost_user_dir=DIR, log_file=PATH,
log_level=LEVEL, log_format=text|json, fuse_transport=T and io_engine=E set
the flags of the same name; nofail, _netdev, noauto, x-systemd.* and the
other generic options are accepted and left to mount(8) and systemd; ro is
refused.

STORE may be a Ceph RBD image, rbd:POOL/IMAGE (see vdisk format). Its
exclusive lock makes sure one client at a time mounts it, on any host:
while one holds it, a second mount fails naming the holder. A holder that
died lets go once the cluster notices (osd_client_watch_timeout, 30 s by
default). --break-lock takes the store over at once from a holder that is
dead or must be stopped: the cluster first blocklists the holder, so that
it can never write to the image again, then its lock is broken.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, mnt := "", args[0]
			if len(args) == 2 {
				store, mnt = args[0], args[1]
			}
			for _, o := range f.options {
				if err := applyMountOptions(e, &f, o); err != nil {
					return err
				}
			}
			return runMount(e, store, mnt, f)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.allowOther, "allow-other", false, "let other users use the mount (permissions are still checked)")
	fl.BoolVar(&f.debug, "debug", false, "log every FUSE request")
	fl.BoolVarP(&f.foreground, "foreground", "f", false, "stay in the foreground instead of going to the background once mounted")
	fl.IntVar(&f.readyFD, "ready-fd", 0, "with --foreground: write \"ready\" to this file descriptor once mounted")
	fl.StringVar(&f.logFile, "log-file", "", "log file in the background (default $XDG_STATE_HOME/vdiskfs/mount-<MOUNTPOINT>.log)")
	fl.Var(&f.defaultSize, "default-size", "size of the default store when it is created (default: 64G or 3/4 of the free space)")
	fl.DurationVar(&f.commitInterval, "commit-interval", image.DefaultCommitInterval, "commit and flush unsynced writes' new mappings, sizes and names at least this often (overwrites in place become durable at the next flush)")
	fl.StringVar(&f.ioEngine, "io-engine", "auto", "how the store's data reads are issued: io_uring, pread, or auto (io_uring when the kernel allows it); writes are pwrite")
	fl.StringVar(&f.fuseTransport, "fuse-transport", "auto", "how FUSE requests reach vdiskfs: io_uring (FUSE-over-io_uring; turns on the fuse module's enable_uring), dev (/dev/fuse), or auto (io_uring when enabled)")
	fl.StringVar(&f.metricsAddr, "metrics", "", "serve Prometheus metrics on this loopback address (e.g. 127.0.0.1:9477)")
	fl.StringVar(&f.socketGroup, "socket-group", "", "let the members of this group (a name or a gid) use the mount's control socket (vdisk stats, sync, snapshot, send, ...) besides root and the daemon's user")
	fl.StringVar(&f.keyDir, "key-dir", "", "unlock each encrypted disk NAME with the key file DIR/NAME.key (0600 or 0400, owned by the daemon's user; systemd's $CREDENTIALS_DIRECTORY fits); a disk without one stays locked")
	fl.StringVar(&f.vhostUserDir, "vhost-user-dir", "", "serve every disk as a vhost-user-blk device on DIR/NAME.sock too")
	fl.BoolVar(&f.breakLock, "break-lock", false, "for an rbd: store: blocklist the client holding the image's exclusive lock and take the lock over")
	fl.StringArrayVarP(&f.options, "options", "o", nil, "mount(8)-style options, comma-separated (allow_other,commit_interval=5s,metrics=ADDR,...)")
	return cmd
}

func runMount(e *env, store, mnt string, f mountFlags) (err error) {
	if _, err := backend.ParseEngine(f.ioEngine); err != nil {
		return usageErrorf("--io-engine: %v", err)
	}
	if _, err := fs.ParseTransport(f.fuseTransport); err != nil {
		return usageErrorf("--fuse-transport: %v", err)
	}
	if f.socketGroup != "" {
		if _, err := telemetry.LookupGroup(f.socketGroup); err != nil {
			return usageErrorf("--socket-group: %v", err)
		}
	}
	if f.vhostUserDir != "" {
		if f.vhostUserDir, err = filepath.Abs(f.vhostUserDir); err != nil {
			return err
		}
		if fi, serr := os.Stat(f.vhostUserDir); serr != nil || !fi.IsDir() {
			return usageErrorf("--vhost-user-dir %s: not a directory", f.vhostUserDir)
		}
	}
	if f.breakLock && !backend.IsRBD(store) {
		return usageErrorf("--break-lock applies to an rbd:POOL/IMAGE store only: a file's or a device's lock goes away with the process holding it")
	}
	mnt, err = filepath.Abs(mnt)
	if err != nil {
		return err
	}
	if store == "" {
		if store, err = ensureDefaultStore(e, f.defaultSize.n); err != nil {
			return err
		}
	}
	// Absolute: the daemon names it as the mount's source, which vdisk
	// umount and the wait for a closing daemon (holder.go) look up.
	if !backend.IsRBD(store) {
		if store, err = filepath.Abs(store); err != nil {
			return err
		}
	}
	if err := e.waitClosed(store); err != nil {
		return err
	}
	if !f.foreground {
		return daemonize(e, store, mnt, f)
	}
	return serveMount(e, store, mnt, f)
}

// serveMount mounts and serves until a signal or an unmount, then commits
// and closes the store.
func serveMount(e *env, store, mnt string, f mountFlags) (err error) {
	if err := prepareMountpoint(e, mnt); err != nil {
		return err
	}
	engine, err := backend.ParseEngine(f.ioEngine)
	if err != nil {
		return usageErrorf("--io-engine: %v", err)
	}
	transport, err := fs.ParseTransport(f.fuseTransport)
	if err != nil {
		return usageErrorf("--fuse-transport: %v", err)
	}
	// The transport is settled once, here: the kernel made ready for it,
	// then the store's engine and the mount both follow from it.
	if err := fs.PrepareTransport(transport); err != nil {
		return fmt.Errorf("--fuse-transport=%s: %w", transport, err)
	}
	engine = fs.StoreEngine(transport, engine)
	topts := telemetry.Options{MetricsAddr: f.metricsAddr}
	fopts := fs.Options{AllowOther: f.allowOther, Debug: f.debug, Logger: e.log, Transport: transport, FsName: store,
		VhostUserDir: f.vhostUserDir}
	if f.socketGroup != "" {
		g, err := telemetry.LookupGroup(f.socketGroup)
		if err != nil {
			return usageErrorf("--socket-group: %v", err)
		}
		topts.SocketGroup = &g
		gid := int(g.GID)
		fopts.VhostUserGroup = &gid
	}
	if f.breakLock {
		if err := breakLock(e, store); err != nil {
			return err
		}
	}
	s, err := e.openPath(store, image.Options{Logger: e.log, Program: mountProgram, CommitInterval: f.commitInterval, IOEngine: engine})
	if err != nil {
		return err
	}
	if f.keyDir != "" {
		unlockKeyDir(e.log, s, f.keyDir)
	}
	procs := fs.TuneRuntime() // before Mount: go-fuse sizes its readers from it
	// The store's path is the mount's source in /proc/mounts, as sshfs names
	// its remote: findmnt and vdisk umount tell which store a mount serves.
	srv, err := fs.Mount(s, mnt, fopts)
	if err != nil {
		s.Close()
		return err
	}
	// vdisk stats reads the mount's socket; --metrics adds a TCP listener.
	// Without the socket the mount still serves its disks, unless the
	// socket was asked for a group or metrics were asked for.
	src := mountSource{s: s, srv: srv, log: e.log}
	topts.Logger = e.log
	stopTelemetry, err := telemetry.Start(telemetry.Handler(src, mnt, store), src, mnt, topts)
	if err != nil {
		if f.metricsAddr != "" || f.socketGroup != "" {
			srv.Unmount()
			s.Close()
			return err
		}
		e.log.WithError(err).Warn("vdisk stats will not be available for this mount")
	}
	defer stopTelemetry()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	unmounted := make(chan struct{})
	go func() {
		srv.Wait()
		close(unmounted)
	}()
	used, why := s.IOEngine()
	fields := logrus.Fields{"store": store, "mountpoint": mnt, "pid": os.Getpid(), "gomaxprocs": procs, "io_engine": used}
	if why != "" {
		fields["io_uring_unavailable"] = why
	}
	if h := s.LockHolder(); h != "" {
		fields["lock_holder"] = h
	}
	e.log.WithFields(fields).Info("serving")
	signalReady(e, f.readyFD)

	select {
	case sig := <-sigs:
		e.log.WithField("signal", sig.String()).Info("unmounting")
		if uerr := srv.Unmount(); uerr != nil {
			e.log.WithError(uerr).Error("unmount")
		}
	case <-unmounted:
		e.log.Info("unmounted from outside")
	}
	// The socket goes before the store's lock: once the lock is free, the
	// next daemon for this mount point may create its own.
	stopTelemetry()
	if cerr := s.Close(); cerr != nil {
		return fmt.Errorf("close store %s: %w", store, cerr)
	}
	e.log.Info("store closed cleanly")
	return nil
}

// breakLock takes the exclusive lock of the RBD store from its holder, who
// the cluster blocklists first (backend.BreakLock), and logs whom it broke.
func breakLock(e *env, store string) error {
	broken, err := backend.BreakLock(store)
	if err != nil {
		return fmt.Errorf("--break-lock: %w", err)
	}
	if len(broken) == 0 {
		e.log.WithField("store", store).Info("--break-lock: no client held the lock")
	}
	for _, h := range broken {
		e.log.WithFields(logrus.Fields{"store": store, "holder": h}).Warn("blocklisted the holder of the store's lock and broke its lock")
	}
	return nil
}

// signalReady tells whoever waits that the mount is usable: the ready pipe
// of the parent (or of a script), and systemd.
func signalReady(e *env, fd int) {
	if fd > 0 {
		w := os.NewFile(uintptr(fd), "ready-fd")
		if _, err := w.WriteString("ready\n"); err != nil {
			e.log.WithError(err).Warn("writing to --ready-fd")
		}
		w.Close()
	}
	if addr := os.Getenv("NOTIFY_SOCKET"); addr != "" {
		if c, err := net.Dial("unixgram", addr); err == nil {
			c.Write([]byte("READY=1"))
			c.Close()
		}
	}
}

// prepareMountpoint creates the mount point if missing, and clears dead
// mounts left by a daemon that was killed. statfs, unlike stat, is never
// answered from the kernel's attribute cache, so it finds them: ENOTCONN,
// or ECONNABORTED or ECANCELED when the kernel aborts the connection or
// cancels the request while the call waits (right after a kill -9 the
// connection lives on until the dead daemon's io_uring is torn down). A
// stat in that window fails the same ways, so any of those errors from
// either call detaches and looks again.
func prepareMountpoint(e *env, mnt string) error {
	var st unix.Stat_t
	for tries := 1; ; tries++ {
		var sfs unix.Statfs_t
		err := unix.Statfs(mnt, &sfs)
		if err == nil || errors.Is(err, unix.ENOENT) {
			err = unix.Stat(mnt, &st)
		}
		if !deadMount(err) {
			switch {
			case errors.Is(err, unix.ENOENT):
				return os.MkdirAll(mnt, 0o755)
			case err != nil:
				return fmt.Errorf("mount point %s: %w", mnt, err)
			case st.Mode&unix.S_IFMT != unix.S_IFDIR:
				return fmt.Errorf("mount point %s is not a directory", mnt)
			}
			return nil
		}
		if tries == 10 {
			return fmt.Errorf("mount point %s: a dead mount is still there after %d detaches: %w", mnt, tries-1, err)
		}
		e.log.WithField("mountpoint", mnt).Warn("a dead mount is left there (its daemon was killed); detaching it")
		if uerr := unix.Unmount(mnt, unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
			return fmt.Errorf("mount point %s: detach the dead mount: %w", mnt, uerr)
		}
	}
}

// deadMount reports whether err is how a call on a mount whose daemon is
// gone fails.
func deadMount(err error) bool {
	return errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.ECANCELED)
}

// daemonize starts this program again in the foreground, detached (own
// session, no terminal), and returns once it reports the mount ready, or
// with its error when it fails first.
func daemonize(e *env, store, mnt string, f mountFlags) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	logPath := f.logFile
	if logPath == "" {
		if logPath, err = defaultLogPath(mnt); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return fmt.Errorf("log directory: %w", err)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	args := []string{"mount", store, mnt, "--foreground", "--ready-fd", "3",
		"--log-level", e.log.GetLevel().String(), "--log-format", e.logFormat, "--commit-interval", f.commitInterval.String()}
	if f.allowOther {
		args = append(args, "--allow-other")
	}
	if f.debug {
		args = append(args, "--debug")
	}
	if f.ioEngine != "auto" {
		args = append(args, "--io-engine", f.ioEngine)
	}
	if f.fuseTransport != "auto" {
		args = append(args, "--fuse-transport", f.fuseTransport)
	}
	if f.metricsAddr != "" {
		args = append(args, "--metrics", f.metricsAddr)
	}
	if f.socketGroup != "" {
		args = append(args, "--socket-group", f.socketGroup)
	}
	if f.breakLock {
		args = append(args, "--break-lock")
	}
	if f.vhostUserDir != "" {
		args = append(args, "--vhost-user-dir", f.vhostUserDir)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("start the mount daemon: %w", err)
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) == "ready" {
		fmt.Fprintf(e.stdout, "mounted %s at %s (pid %d, log %s)\n", store, mnt, cmd.Process.Pid, logPath)
		return cmd.Process.Release()
	}
	werr := cmd.Wait()
	tail, _ := os.ReadFile(logPath)
	if int64(len(tail)) >= start {
		tail = tail[start:]
	}
	return fmt.Errorf("mount failed (%v): %s", werr, strings.TrimSpace(string(tail)))
}

// dataHome is $XDG_DATA_HOME, else ~/.local/share.
func dataHome() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for the default store: %w", err)
	}
	return filepath.Join(home, ".local", "share"), nil
}

func defaultLogPath(mnt string) (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no home directory for the log file; pass --log-file: %w", err)
		}
		dir = filepath.Join(home, ".local", "state")
	}
	name := strings.Trim(strings.ReplaceAll(mnt, "/", "-"), "-")
	return filepath.Join(dir, "vdiskfs", "mount-"+name+".log"), nil
}

// ensureDefaultStore returns the default store's path, creating and
// formatting it first when it does not exist.
func ensureDefaultStore(e *env, size int64) (string, error) {
	home, err := dataHome()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, "vdiskfs")
	path := filepath.Join(dir, "default.store")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("default store directory: %w", err)
	}
	if size == 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return "", fmt.Errorf("free space for the default store: %w", err)
		}
		size = min(64<<30, int64(st.Bavail)*st.Bsize/4*3) / (1 << 30) * (1 << 30)
		if size < 1<<30 {
			return "", fmt.Errorf("only %s free in %s: not enough for a default store; pass a STORE", formatSize(int64(st.Bavail)*st.Bsize), dir)
		}
	}
	if err := image.FormatPath(path, size, image.FormatOptions{}); err != nil {
		return "", fmt.Errorf("create the default store: %w", err)
	}
	e.log.WithFields(logrus.Fields{"store": path, "size": formatSize(size)}).Info("created the default store")
	fmt.Fprintf(e.stderr, "created the default store %s (%s, sparse)\n", path, formatSize(size))
	return path, nil
}
