//go:build rbd

package backend

/*
#cgo LDFLAGS: -lrbd
#include <errno.h>
#include <stdlib.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
*/
import "C"

import (
	"bytes"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
)

// rbdImage is an open librbd image handle (rbd_image_t), used through
// librbd's C API directly rather than through go-ceph's rbd.Image.
//
// Why: the data path is librbd's asynchronous API (rbd_aio.go), which
// go-ceph v0.28.0 does not have, and it must run on the handle that holds
// the exclusive lock: a second handle in the same process would be
// refused the lock by the first, which holds it in exclusive mode. go-ceph
// gives no access to the rbd_image_t inside an rbd.Image (an unexported
// field; reading it with unsafe would break silently with any change to
// go-ceph's struct), but it does export the pool's rados_ioctx_t
// (rados.IOContext.Pointer, a documented accessor for exactly this). So
// the backend opens the image itself with rbd_open on go-ceph's I/O
// context and does everything on the image through this handle: size,
// lock, lock owners, lockers, watchers, breaking a lock, I/O, close.
// go-ceph keeps the connection, the pool context and image create/remove.
//
// The handle is safe for concurrent use (librbd is thread-safe) except
// close, which the caller must order after every other call; the
// IOContext it was opened on must outlive it.
type rbdImage struct {
	img  C.rbd_image_t
	spec string // POOL[/NAMESPACE]/IMAGE, for messages
}

// rbdRet turns a librbd return value into nil (>= 0) or its errno.
func rbdRet(ret C.int) error {
	if ret >= 0 {
		return nil
	}
	return syscall.Errno(-ret)
}

// openRBDImage opens the image name in ioctx's pool and namespace, at its
// head (no snapshot). Errors are the errno librbd returns (ENOENT for a
// missing image).
func openRBDImage(ioctx *rados.IOContext, name, spec string, readOnly bool) (*rbdImage, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	io := C.rados_ioctx_t(ioctx.Pointer())
	var img C.rbd_image_t
	var ret C.int
	if readOnly {
		ret = C.rbd_open_read_only(io, cname, &img, nil)
	} else {
		ret = C.rbd_open(io, cname, &img, nil)
	}
	if err := rbdRet(ret); err != nil {
		return nil, err
	}
	return &rbdImage{img: img, spec: spec}, nil
}

// close closes the handle (rbd_close), which releases the exclusive lock
// if this handle holds it. No other call may run or follow.
func (i *rbdImage) close() error { return rbdRet(C.rbd_close(i.img)) }

// size is the image's size in bytes.
func (i *rbdImage) size() (uint64, error) {
	var size C.uint64_t
	if err := rbdRet(C.rbd_get_size(i.img, &size)); err != nil {
		return 0, err
	}
	return uint64(size), nil
}

// lockAcquireExclusive takes the exclusive lock in exclusive mode
// (rbd_lock_acquire with RBD_LOCK_MODE_EXCLUSIVE): librbd then never
// hands it to another client that asks. EROFS or EBUSY: another client
// holds it; EINVAL: the image lacks the exclusive-lock feature.
func (i *rbdImage) lockAcquireExclusive() error {
	return rbdRet(C.rbd_lock_acquire(i.img, C.RBD_LOCK_MODE_EXCLUSIVE))
}

// isExclusiveLockOwner says whether this handle holds the exclusive lock.
func (i *rbdImage) isExclusiveLockOwner() (bool, error) {
	var owner C.int
	if err := rbdRet(C.rbd_is_exclusive_lock_owner(i.img, &owner)); err != nil {
		return false, err
	}
	return owner != 0, nil
}

// lockOwners lists the owners of the exclusive lock, each as the address
// librbd names it by ("127.0.0.1:0/495665570"); none when it is free.
func (i *rbdImage) lockOwners() ([]string, error) {
	capacity := 4
	for {
		owners := (**C.char)(C.calloc(C.size_t(capacity), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		if owners == nil {
			return nil, syscall.ENOMEM
		}
		n := C.size_t(capacity)
		var mode C.rbd_lock_mode_t
		ret := C.rbd_lock_get_owners(i.img, &mode, owners, &n)
		switch {
		case ret == -C.ENOENT:
			C.free(unsafe.Pointer(owners))
			return nil, nil
		case ret == -C.ERANGE:
			C.free(unsafe.Pointer(owners))
			capacity = max(2*capacity, int(n))
			continue
		case ret < 0:
			C.free(unsafe.Pointer(owners))
			return nil, syscall.Errno(-ret)
		}
		list := unsafe.Slice(owners, int(n))
		names := make([]string, len(list))
		for k, o := range list {
			names[k] = C.GoString(o)
		}
		C.rbd_lock_get_owners_cleanup(owners, n)
		C.free(unsafe.Pointer(owners))
		return names, nil
	}
}

// lockBreak breaks the exclusive lock of owner (an address from
// lockOwners); with rbd_blocklist_on_break_lock (which dialRBD sets)
// librbd first has the cluster blocklist it. ENOENT: it let go meanwhile.
func (i *rbdImage) lockBreak(owner string) error {
	cowner := C.CString(owner)
	defer C.free(unsafe.Pointer(cowner))
	return rbdRet(C.rbd_lock_break(i.img, C.RBD_LOCK_MODE_EXCLUSIVE, cowner))
}

// rbdLocker is one holder of an image's lock record (rbd_list_lockers).
type rbdLocker struct {
	Client string // client.N
	Cookie string
	Addr   string
}

// lockers lists the holders of the image's lock record (the exclusive
// lock's is "auto ..." cookies); none when it is free.
func (i *rbdImage) lockers() ([]rbdLocker, error) {
	var exclusive C.int
	var tagLen, clientsLen, cookiesLen, addrsLen C.size_t
	for {
		// The first round asks for the sizes (ERANGE with sizes filled
		// in, or 0 lockers); later ones retry if the record grew.
		bufs := make([][]byte, 4)
		for k, n := range []C.size_t{tagLen, clientsLen, cookiesLen, addrsLen} {
			bufs[k] = make([]byte, n+1) // +1: never a zero-length buffer
		}
		ptr := func(b []byte) *C.char { return (*C.char)(unsafe.Pointer(&b[0])) }
		ret := C.rbd_list_lockers(i.img, &exclusive, ptr(bufs[0]), &tagLen, ptr(bufs[1]), &clientsLen,
			ptr(bufs[2]), &cookiesLen, ptr(bufs[3]), &addrsLen)
		switch {
		case ret == -C.ERANGE:
			continue
		case ret < 0:
			return nil, syscall.Errno(-ret)
		case ret == 0:
			return nil, nil
		}
		clients := splitNUL(bufs[1][:clientsLen])
		cookies := splitNUL(bufs[2][:cookiesLen])
		addrs := splitNUL(bufs[3][:addrsLen])
		n := int(ret)
		if len(clients) < n || len(cookies) < n || len(addrs) < n {
			return nil, fmt.Errorf("rbd_list_lockers: %d lockers but %d clients, %d cookies, %d addresses",
				n, len(clients), len(cookies), len(addrs))
		}
		out := make([]rbdLocker, n)
		for k := range out {
			out[k] = rbdLocker{Client: clients[k], Cookie: cookies[k], Addr: addrs[k]}
		}
		return out, nil
	}
}

// splitNUL splits a buffer of NUL-terminated strings.
func splitNUL(b []byte) []string {
	var out []string
	for len(b) > 0 {
		end := bytes.IndexByte(b, 0)
		if end < 0 {
			end = len(b)
		}
		out = append(out, string(b[:end]))
		b = b[min(end+1, len(b)):]
	}
	return out
}

// watchers lists the addresses of the clients watching the image: every
// live opener, the lock holder among them.
func (i *rbdImage) watchers() ([]string, error) {
	capacity := C.size_t(16)
	for {
		list := make([]C.rbd_image_watcher_t, capacity)
		n := capacity
		ret := C.rbd_watchers_list(i.img, &list[0], &n)
		if ret == -C.ERANGE && n > capacity {
			capacity = n
			continue
		}
		if err := rbdRet(ret); err != nil {
			return nil, err
		}
		addrs := make([]string, n)
		for k, w := range list[:n] {
			addrs[k] = C.GoString(w.addr)
		}
		C.rbd_watchers_list_cleanup(&list[0], n)
		return addrs, nil
	}
}
