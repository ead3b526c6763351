package fs

import (
	"errors"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// errnoOf maps an error from package image to the errno the kernel gets.
// The order matters: a failed or closed store is EIO whatever it wraps, and
// so is a backing another client took over (an RBD image whose lock was
// broken: EROFS or ESHUTDOWN from librbd mean nothing to a disk's user), and
// the image sentinels win over a backend errno they may carry.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.Is(err, image.ErrFailed), errors.Is(err, image.ErrClosed), errors.Is(err, backend.ErrFenced):
		return syscall.EIO
	case errors.Is(err, image.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, image.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, image.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, image.ErrInvalidName), errors.Is(err, image.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, image.ErrTooLarge):
		return syscall.EFBIG
	case errors.Is(err, image.ErrNoData):
		return syscall.ENXIO
	case errors.Is(err, image.ErrReadOnly), errors.Is(err, image.ErrReadOnlyDisk):
		return syscall.EROFS
	case errors.Is(err, image.ErrLocked):
		return syscall.ENOKEY
	case errors.Is(err, image.ErrWrongKey):
		return syscall.EKEYREJECTED
	case errors.Is(err, image.ErrCrossKey):
		return syscall.EXDEV
	case errors.Is(err, image.ErrBusy):
		return syscall.EBUSY
	case errors.Is(err, image.ErrNotEncrypted):
		return syscall.EINVAL
	case errors.As(err, &errno) && errno != 0:
		return errno
	}
	return syscall.EIO
}

// quietErrno lists the answers that are a normal outcome of what the caller
// asked (a lookup of a missing name, SEEK_DATA past the last extent, a
// rename onto an existing name with RENAME_NOREPLACE): logged at debug level
// only.
func quietErrno(e syscall.Errno) bool {
	switch e {
	case syscall.ENOENT, syscall.EEXIST, syscall.ENXIO, syscall.EINVAL,
		syscall.ENAMETOOLONG, syscall.EROFS, syscall.EOPNOTSUPP,
		syscall.ENOTDIR, syscall.EPERM, syscall.EINTR:
		return true
	}
	return false
}

// toErrno is the one place where an error becomes a syscall.Errno for
// go-fuse. It logs the error once, with the operation, the fields the caller
// gives (disk name, offset, ...) and the errno: errors a caller can cause on
// purpose at debug level, ENOSPC and EFBIG as warnings, everything else
// (EIO above all) as an error.
func (v *vfs) toErrno(err error, op string, fields logrus.Fields) syscall.Errno {
	if err == nil {
		return 0
	}
	e := errnoOf(err)
	if e == syscall.EINVAL && errors.Is(err, image.ErrInvalidName) {
		if name, ok := fields["disk"].(string); ok && len(name) > image.MaxNameLen {
			e = syscall.ENAMETOOLONG
		}
	}
	l := v.log.WithFields(fields).WithFields(logrus.Fields{"op": op, "errno": e.Error()}).WithError(err)
	switch {
	case quietErrno(e):
		l.Debug("request refused")
	case e == syscall.ENOSPC || e == syscall.EFBIG:
		l.Warn("request failed")
	default:
		l.Error("request failed")
	}
	return e
}

// checkName answers ENAMETOOLONG for a name image could never hold (the
// kernel lets names up to 1024 bytes through to FUSE), before any store call.
func checkName(name string) syscall.Errno {
	if len(name) > image.MaxNameLen {
		return syscall.ENAMETOOLONG
	}
	return 0
}
