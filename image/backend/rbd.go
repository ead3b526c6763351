//go:build rbd

package backend

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// RBDSupported says whether this build has the RBD backend (build tag rbd).
const RBDSupported = true

// RBD is a Backend on a Ceph RBD image, through librbd: a user-space
// client, no kernel module. github.com/ceph/go-ceph makes the connection
// and the pool's I/O context; the image is opened on that context and used
// through librbd's C API (rbdImage), its data through the asynchronous
// calls (rbdAIO). Create it with Open and an RBD store name (RBDName). See
// the package documentation, "RBD".
type RBD struct {
	name       RBDName
	desc       string
	size       int64
	readOnly   bool
	cache      bool // librbd's write-back cache is on (rbd_cache): durable writes must flush
	conn       *rados.Conn
	ioctx      *rados.IOContext
	lockHolder string // this client, as a second opener would see it named

	// mu is held for reading by every operation on img, for as long as
	// it is in flight, and for writing by Close, so Close never closes
	// the image under a running call or one librbd has not completed.
	// Operations never wait for each other. An I/O started on a
	// completion queue (rbdCompletions.Start) holds it only while librbd
	// takes the I/O: its completion goes to the caller's queue, whose C
	// memory is freed only once every callback into it has returned,
	// whether the image is still open or not.
	mu struct {
		sync.RWMutex
		img *rbdImage // the handle that holds the lock; nil once closed
		aio *rbdAIO   // the data path on img; nil once closed
	}
}

var _ Backend = (*RBD)(nil)

// rbdSectorSize is the alignment the RBD backend asks for. librbd takes any
// byte range; 512 is what a virtual disk on RBD advertises (QEMU's rbd
// driver does), and the backend checks it like O_DIRECT so that a store
// issues the same I/O on RBD as on a file.
const rbdSectorSize = 512

// rbdFeatures are the features of an image `vdisk format` creates: the
// rbd command's defaults. exclusive-lock is the one the backend needs.
const rbdFeatures = rbd.FeatureLayering | rbd.FeatureExclusiveLock | rbd.FeatureObjectMap |
	rbd.FeatureFastDiff | rbd.FeatureDeepFlatten

// openRBD opens the image named by spec. Read-write (unless opts.NoLock)
// it takes the image's exclusive lock in exclusive mode, which librbd then
// never hands to another client on request: a second opener anywhere gets
// ErrLocked naming this one. Read-only it takes no lock but refuses an
// image whose lock is held, as a shared flock refuses a file with a writer.
func openRBD(spec string, opts OpenOptions) (Backend, error) {
	if opts.Engine == EngineIOUring {
		return nil, fmt.Errorf("open %s: an RBD store does its I/O through librbd; the io_uring engine does not apply", spec)
	}
	c, err := dialRBD(spec)
	if err != nil {
		return nil, err
	}
	r := &RBD{name: c.name, desc: fmt.Sprintf("rbd image %q", c.name.ImageSpec()), readOnly: opts.ReadOnly,
		conn: c.conn, ioctx: c.ioctx}
	if r.cache, err = rbdCacheOn(c.conn); err != nil {
		c.close()
		return nil, fmt.Errorf("open %s: %w", r.desc, err)
	}
	img, err := c.openImage(opts.ReadOnly)
	if err != nil {
		c.close()
		return nil, err
	}
	aio, err := newRBDAIO(img)
	if err != nil {
		img.close()
		c.close()
		return nil, fmt.Errorf("open %s: %w", r.desc, err)
	}
	r.mu.img, r.mu.aio = img, aio
	if err := r.init(opts); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// init reads the size and takes the lock, or checks that no one holds it.
func (r *RBD) init(opts OpenOptions) error {
	img := r.mu.img
	size, err := img.size()
	if err != nil {
		return fmt.Errorf("open %s: size: %w", r.desc, err)
	}
	if size%rbdSectorSize != 0 {
		return fmt.Errorf("open %s: its size %d is not a multiple of %d bytes", r.desc, size, rbdSectorSize)
	}
	r.size = int64(size)
	if opts.NoLock {
		return nil
	}
	if opts.ReadOnly {
		// A read-only image cannot ask for the lock's owners; its lockers
		// (read at open) and watchers tell the same: a holder that is
		// alive keeps a watch on the image, a dead one's lock record
		// stays behind until the next read-write opener breaks it.
		live, err := liveLockers(img)
		if err != nil {
			return fmt.Errorf("open %s: %w", r.desc, err)
		}
		if len(live) > 0 {
			return fmt.Errorf("open %s: in use: the exclusive lock is held by %s: %w", r.desc, strings.Join(live, ", "), ErrLocked)
		}
		return nil
	}
	if errno := img.lockAcquireExclusive(); errno != nil {
		switch {
		case errors.Is(errno, syscall.EROFS), errors.Is(errno, syscall.EBUSY):
			owners, _ := img.lockOwners()
			return fmt.Errorf("open %s: the exclusive lock is held by %s: %w", r.desc, lockHolders(img, owners), ErrLocked)
		case errors.Is(errno, syscall.EINVAL):
			return fmt.Errorf("open %s: the image lacks the exclusive-lock feature, without which nothing fences a second host "+
				"(rbd feature enable %s exclusive-lock): %w", r.desc, r.name.ImageSpec(), errno)
		default:
			return fmt.Errorf("open %s: take the exclusive lock: %w", r.desc, rbdErrnoFenced(errno))
		}
	}
	if owner, err := img.isExclusiveLockOwner(); err != nil || !owner {
		return fmt.Errorf("open %s: the exclusive lock was taken but this client does not own it (%v): %w", r.desc, err, ErrLocked)
	}
	r.lockHolder = fmt.Sprintf("client.%d", r.conn.GetInstanceID())
	if owners, err := img.lockOwners(); err == nil && len(owners) == 1 {
		r.lockHolder += " at " + owners[0]
	}
	return nil
}

// liveLockers names the holders of img's lock that are alive: those with a
// watch on the image.
func liveLockers(img *rbdImage) ([]string, error) {
	lockers, err := img.lockers()
	if err != nil {
		return nil, fmt.Errorf("lockers: %w", err)
	}
	if len(lockers) == 0 {
		return nil, nil
	}
	watchers, err := img.watchers()
	if err != nil {
		return nil, fmt.Errorf("watchers: %w", err)
	}
	var live []string
	for _, l := range lockers {
		for _, addr := range watchers {
			if addr == l.Addr {
				live = append(live, fmt.Sprintf("%s at %s (lock cookie %q)", l.Client, l.Addr, l.Cookie))
				break
			}
		}
	}
	return live, nil
}

// rbdConn is a connection to a cluster with an I/O context on the pool
// (and namespace) of an image.
type rbdConn struct {
	name  RBDName
	conn  *rados.Conn
	ioctx *rados.IOContext
}

// dialRBD parses spec and connects to its cluster: the client id from the
// name, else from CEPH_ARGS; the configuration file from the name, else
// CEPH_CONF or librados's search; then CEPH_ARGS, then the name's options.
// A mon that does not answer fails the connection after
// client_mount_timeout, which is lowered from librados's 300 s to 30 s
// unless configured.
func dialRBD(spec string) (*rbdConn, error) {
	n, err := ParseRBDName(spec)
	if err != nil {
		return nil, err
	}
	user := n.User
	if user == "" {
		user = cephArgsUser(os.Getenv("CEPH_ARGS"))
	}
	var conn *rados.Conn
	if user != "" {
		conn, err = rados.NewConnWithUser(user)
	} else {
		conn, err = rados.NewConn()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: create a Ceph client: %w", spec, rbdErrno(err))
	}
	if n.Conf != "" {
		err = conn.ReadConfigFile(n.Conf)
	} else {
		err = conn.ReadDefaultConfigFile()
	}
	if err != nil {
		conn.Shutdown()
		where := n.Conf
		if where == "" {
			where = "$CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config or ./ceph.conf"
			if c := os.Getenv("CEPH_CONF"); c != "" {
				where = c + " ($CEPH_CONF)"
			}
		}
		return nil, fmt.Errorf("%s: read the Ceph configuration from %s (--ceph-conf names another): %w", spec, where, rbdErrno(err))
	}
	if err := conn.ParseDefaultConfigEnv(); err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("%s: CEPH_ARGS: %w", spec, rbdErrno(err))
	}
	if v, err := conn.GetConfigOption("client_mount_timeout"); err == nil && (v == "300" || v == "300.000000") {
		_ = conn.SetConfigOption("client_mount_timeout", "30")
	}
	for _, o := range n.Options {
		if err := conn.SetConfigOption(o[0], o[1]); err != nil {
			conn.Shutdown()
			return nil, fmt.Errorf("%s: Ceph option %s=%s: %w", spec, o[0], o[1], rbdErrno(err))
		}
	}
	// Breaking a lock must fence its holder, whatever the configuration
	// says: librbd blocklists the holder before it breaks the lock.
	_ = conn.SetConfigOption("rbd_blocklist_on_break_lock", "true")
	// The store has its own flush discipline; librbd's cache would only
	// add a copy (QEMU turns it off for cache=none too).
	setDefaultOption(conn, n, "rbd_cache", "false")
	// On, librbd hands every rbd_aio_* call to its io_context_pool
	// thread; off, the caller (a queue owner or a worker) takes it to the
	// Objecter itself, one thread hop less per I/O. What must wait on
	// that path (the lock, a refresh) is queued, not waited for; the
	// caller waits only in the Objecter's throttle
	// (objecter_inflight_op_bytes, 100 MiB in flight by default).
	setDefaultOption(conn, n, "rbd_non_blocking_aio", "false")
	if err := conn.Connect(); err != nil {
		conn.Shutdown()
		return nil, fmt.Errorf("%s: connect to the Ceph cluster: %w", spec, rbdErrno(err))
	}
	ioctx, err := conn.OpenIOContext(n.Pool)
	if err != nil {
		conn.Shutdown()
		errno := rbdErrno(err)
		if errors.Is(errno, syscall.ENOENT) {
			return nil, fmt.Errorf("%s: the pool %q does not exist (ceph osd pool create %s; rbd pool init %s)",
				spec, n.Pool, n.Pool, n.Pool)
		}
		return nil, fmt.Errorf("%s: pool %q: %w", spec, n.Pool, errno)
	}
	ioctx.SetNamespace(n.Namespace)
	return &rbdConn{name: n, conn: conn, ioctx: ioctx}, nil
}

// setDefaultOption sets a Ceph option unless the name sets it (in any of
// Ceph's spellings: rbd_cache, "rbd cache", rbd-cache).
func setDefaultOption(conn *rados.Conn, n RBDName, key, value string) {
	canon := strings.NewReplacer(" ", "_", "-", "_")
	for _, o := range n.Options {
		if canon.Replace(o[0]) == key {
			return
		}
	}
	_ = conn.SetConfigOption(key, value)
}

func (c *rbdConn) close() {
	c.ioctx.Destroy()
	c.conn.Shutdown()
}

// openImage opens the image (rbdImage: through librbd's C API on go-ceph's
// I/O context); a missing one wraps os.ErrNotExist.
func (c *rbdConn) openImage(readOnly bool) (*rbdImage, error) {
	img, err := openRBDImage(c.ioctx, c.name.Image, c.name.ImageSpec(), readOnly)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("open rbd image %q: %w", c.name.ImageSpec(), os.ErrNotExist)
		}
		return nil, fmt.Errorf("open rbd image %q: %w", c.name.ImageSpec(), err)
	}
	return img, nil
}

// rbdCacheOn reports whether librbd's write-back cache is on for conn.
func rbdCacheOn(conn *rados.Conn) (bool, error) {
	v, err := conn.GetConfigOption("rbd_cache")
	if err != nil {
		return false, fmt.Errorf("rbd_cache: %w", rbdErrno(err))
	}
	return v == "true", nil
}

// lockHolders names the owners of an image's exclusive lock for messages:
// the client (client.N), its address and the lock's cookie, from the
// image's lockers where they match an owner's address, else the address.
func lockHolders(img *rbdImage, owners []string) string {
	if len(owners) == 0 {
		return "another client (it let go since)"
	}
	lockers, _ := img.lockers()
	var names []string
	for _, o := range owners {
		name := "client at " + o
		for _, l := range lockers {
			if l.Addr == o {
				name = fmt.Sprintf("%s at %s (lock cookie %q)", l.Client, l.Addr, l.Cookie)
			}
		}
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

func (r *RBD) Size() int64      { return r.size }
func (r *RBD) SectorSize() int  { return rbdSectorSize }
func (r *RBD) Describe() string { return r.desc }

// LockHolder names this client as the holder of the image's exclusive lock
// ("client.4133 at 127.0.0.1:0/495665570"), as a second opener's error
// names it; "" when opened without the lock.
func (r *RBD) LockHolder() string { return r.lockHolder }

// fencesOtherHosts: the exclusive lock is cluster-wide, and librbd grants
// it only after its previous holder is gone or blocklisted.
func (r *RBD) fencesOtherHosts() bool { return !r.readOnly && r.lockHolder != "" }

func (r *RBD) engine() Engine { return "librbd" }

// ReadAt reads len(p) bytes at off (rbd_aio_read), blocking only the
// calling goroutine.
func (r *RBD) ReadAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	done := 0
	err := r.with(off, n, p, false, func(a *rbdAIO) error {
		ret, err := a.start(aioRead, off, n, p)
		switch {
		case err != nil:
			return rbdErrnoFenced(err)
		case ret != n:
			done = int(min(max(ret, 0), n))
			return fmt.Errorf("read %d of %d bytes: %w", ret, n, io.ErrUnexpectedEOF)
		}
		done = len(p)
		return nil
	})
	if err != nil {
		return done, r.opError("read", off, n, err)
	}
	return done, nil
}

// WriteAt writes len(p) bytes at off (rbd_aio_write). With librbd's cache
// off (the default here) the write is on every replica when it returns.
func (r *RBD) WriteAt(p []byte, off int64) (int, error) { return r.write("write", p, off) }

// WriteAtDurable is WriteAt and, only if librbd's cache is on, a flush:
// without the cache, a completed write is already on every replica's
// stable storage (RADOS acknowledges a write once it is committed).
func (r *RBD) WriteAtDurable(p []byte, off int64) (int, error) {
	done, err := r.write("durable write", p, off)
	if err != nil || !r.cache {
		return done, err
	}
	if err := r.Flush(); err != nil {
		return 0, err
	}
	return done, nil
}

func (r *RBD) write(op string, p []byte, off int64) (int, error) {
	n := int64(len(p))
	err := r.with(off, n, p, true, func(a *rbdAIO) error {
		// A write's return value is 0 or its length; a failure is
		// its -errno (EROFS, ESHUTDOWN when fenced), which
		// go-ceph's synchronous WriteAt used to report as EPERM.
		_, err := a.start(aioWrite, off, n, p)
		return rbdErrnoFenced(err)
	})
	if err != nil {
		return 0, r.opError(op, off, n, err)
	}
	return len(p), nil
}

// Flush is rbd_aio_flush: every completed write is durable when it returns.
func (r *RBD) Flush() error {
	err := r.with(0, 0, nil, false, func(a *rbdAIO) error {
		_, err := a.start(aioFlush, 0, 0, nil)
		return rbdErrnoFenced(err)
	})
	if err != nil {
		return fmt.Errorf("backend %s: flush: %w", r.desc, err)
	}
	return nil
}

// Discard is rbd_aio_discard. librbd frees the whole objects inside the
// range, truncates or zeroes partial ones, and may skip pieces smaller than
// rbd_discard_granularity_bytes: what the range reads afterwards is
// unspecified, as the contract allows.
func (r *RBD) Discard(off, n int64) error {
	err := r.with(off, n, nil, true, func(a *rbdAIO) error {
		if n == 0 {
			return nil
		}
		_, err := a.start(aioDiscard, off, n, nil)
		return rbdErrnoFenced(err)
	})
	if err != nil {
		return r.opError("discard", off, n, err)
	}
	return nil
}

// WriteZeroes is rbd_aio_write_zeroes, which librbd makes a discard
// without granularity: whole objects are freed, partial ones zeroed, and
// the whole range reads as zeros.
func (r *RBD) WriteZeroes(off, n int64) error {
	err := r.with(off, n, nil, true, func(a *rbdAIO) error {
		if n == 0 {
			return nil
		}
		_, err := a.start(aioZeroes, off, n, nil)
		return rbdErrnoFenced(err)
	})
	if err != nil {
		return r.opError("write zeroes", off, n, err)
	}
	return nil
}

// Close closes the image, which releases the exclusive lock, and the
// connection. It waits for running operations. Calling it again returns nil.
func (r *RBD) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	aio := r.mu.aio
	if aio == nil {
		return nil
	}
	r.mu.img, r.mu.aio = nil, nil
	err := aio.close() // and the image
	r.ioctx.Destroy()
	r.conn.Shutdown()
	if err != nil {
		return fmt.Errorf("backend %s: close: %w", r.desc, err)
	}
	return nil
}

// with checks an operation (range and alignment, and that a write is
// allowed) and runs f with the data path, holding r.mu for reading.
func (r *RBD) with(off, n int64, p []byte, write bool, f func(*rbdAIO) error) error {
	if write && r.readOnly {
		return ErrReadOnly
	}
	if err := checkRange(off, n, r.size); err != nil {
		return err
	}
	if err := checkAligned(off, n, p, rbdSectorSize); err != nil {
		return err
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mu.aio == nil {
		return ErrClosed
	}
	return f(r.mu.aio)
}

func (r *RBD) opError(op string, off, n int64, err error) error {
	return fmt.Errorf("backend %s: %s %d bytes at %d: %w", r.desc, op, n, off, err)
}

// rbdErrno turns an error of go-ceph into the syscall.Errno it carries
// (rbd and rados errors hold a negative errno; rbd.ErrNotFound is ENOENT),
// or returns it as it is. nil stays nil.
func rbdErrno(err error) error {
	if err == nil {
		return nil
	}
	var coded interface{ ErrorCode() int }
	if errors.As(err, &coded) && coded.ErrorCode() < 0 {
		return syscall.Errno(-coded.ErrorCode())
	}
	if errors.Is(err, rbd.ErrNotFound) {
		return syscall.ENOENT
	}
	return err
}

// rbdErrnoFenced words the errors that mean this client lost the image to
// another: EROFS (another client holds the exclusive lock now) and
// ESHUTDOWN (the cluster blocklisted this client, after another broke its
// lock). Both wrap ErrFenced and keep the errno.
func rbdErrnoFenced(err error) error {
	switch {
	case errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%w: another client holds the image's exclusive lock now: %w", ErrFenced, err)
	case errors.Is(err, syscall.ESHUTDOWN):
		return fmt.Errorf("%w: the Ceph cluster blocklisted this client (another client broke its lock); "+
			"it can never write to the image again: %w", ErrFenced, err)
	}
	return err
}

// statRBD is Stat for an RBD image.
func statRBD(spec string) (Info, error) {
	c, err := dialRBD(spec)
	if err != nil {
		return Info{}, err
	}
	defer c.close()
	img, err := c.openImage(true)
	if err != nil {
		return Info{}, err
	}
	defer img.close()
	size, err := img.size()
	if err != nil {
		return Info{}, fmt.Errorf("rbd image %q: size: %w", c.name.ImageSpec(), err)
	}
	return Info{Kind: KindRBD, Size: int64(size)}, nil
}

// createRBD is Create for an RBD image: the rbd command's default features
// (exclusive-lock among them) and 4 MiB objects.
func createRBD(spec string, size int64) error {
	c, err := dialRBD(spec)
	if err != nil {
		return err
	}
	defer c.close()
	o := rbd.NewRbdImageOptions()
	defer o.Destroy()
	if err := o.SetUint64(rbd.ImageOptionFeatures, rbdFeatures); err != nil {
		return fmt.Errorf("create rbd image %q: %w", c.name.ImageSpec(), rbdErrno(err))
	}
	if err := o.SetUint64(rbd.ImageOptionOrder, 22); err != nil {
		return fmt.Errorf("create rbd image %q: %w", c.name.ImageSpec(), rbdErrno(err))
	}
	err = rbd.CreateImage(c.ioctx, c.name.Image, uint64(size), o)
	if errno := rbdErrno(err); errors.Is(errno, syscall.EEXIST) {
		return fmt.Errorf("create rbd image %q: %w", c.name.ImageSpec(), os.ErrExist)
	} else if err != nil {
		return fmt.Errorf("create rbd image %q: %w", c.name.ImageSpec(), errno)
	}
	return nil
}

// removeRBD is Remove for an RBD image.
func removeRBD(spec string) error {
	c, err := dialRBD(spec)
	if err != nil {
		return err
	}
	defer c.close()
	if err := rbd.RemoveImage(c.ioctx, c.name.Image); err != nil {
		return fmt.Errorf("remove rbd image %q: %w", c.name.ImageSpec(), rbdErrno(err))
	}
	return nil
}

// breakRBDLock is BreakLock for an RBD image.
func breakRBDLock(spec string) ([]string, error) {
	c, err := dialRBD(spec)
	if err != nil {
		return nil, err
	}
	defer c.close()
	img, err := c.openImage(false)
	if err != nil {
		return nil, err
	}
	defer img.close()
	owners, err := img.lockOwners()
	if err != nil {
		return nil, fmt.Errorf("rbd image %q: exclusive lock owners: %w", c.name.ImageSpec(), err)
	}
	var broken []string
	for _, o := range owners {
		who := lockHolders(img, []string{o})
		if errno := img.lockBreak(o); errno != nil {
			if errors.Is(errno, syscall.ENOENT) {
				continue // it let go meanwhile
			}
			return broken, fmt.Errorf("rbd image %q: break the lock of %s: %w", c.name.ImageSpec(), who, errno)
		}
		broken = append(broken, who)
	}
	return broken, nil
}
