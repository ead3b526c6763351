package fs

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

func TestErrnoOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("disk 3 write 4096 bytes at 0: %w", err) }
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{image.ErrNoSpace, syscall.ENOSPC},
		{wrap(image.ErrNoSpace), syscall.ENOSPC},
		{wrap(image.ErrNotExist), syscall.ENOENT},
		{wrap(image.ErrExist), syscall.EEXIST},
		{wrap(image.ErrInvalidName), syscall.EINVAL},
		{wrap(image.ErrInvalid), syscall.EINVAL},
		{wrap(image.ErrTooLarge), syscall.EFBIG},
		{wrap(image.ErrNoData), syscall.ENXIO},
		{wrap(image.ErrReadOnly), syscall.EROFS},
		{wrap(image.ErrReadOnlyDisk), syscall.EROFS},
		{wrap(image.ErrLocked), syscall.ENOKEY},
		{wrap(image.ErrWrongKey), syscall.EKEYREJECTED},
		{wrap(image.ErrCrossKey), syscall.EXDEV},
		{wrap(image.ErrBusy), syscall.EBUSY},
		{wrap(image.ErrClosed), syscall.EIO},
		{wrap(image.ErrCorrupt), syscall.EIO},
		{wrap(fmt.Errorf("%w: %w", image.ErrFailed, syscall.ENOSPC)), syscall.EIO}, // failed wins
		{wrap(syscall.EIO), syscall.EIO},
		{wrap(fmt.Errorf("%w: %w", backend.ErrFenced, syscall.EROFS)), syscall.EIO}, // not a read-only disk
		{wrap(fmt.Errorf("%w: %w", backend.ErrFenced, syscall.ESHUTDOWN)), syscall.EIO},
		{wrap(&wrappedErrno{syscall.ENODEV}), syscall.ENODEV},
		{wrap(syscall.Errno(0)), syscall.EIO},
		{errors.New("something else"), syscall.EIO},
		{io.ErrUnexpectedEOF, syscall.EIO},
	} {
		if got := errnoOf(c.err); got != c.want {
			t.Errorf("errnoOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

type wrappedErrno struct{ e syscall.Errno }

func (w *wrappedErrno) Error() string { return "backend: " + w.e.Error() }
func (w *wrappedErrno) Unwrap() error { return w.e }

func TestToErrnoLogs(t *testing.T) {
	lg, hook := test.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	v := &vfs{log: lg}

	long := strings.Repeat("n", image.MaxNameLen+1)
	if e := v.toErrno(fmt.Errorf("create: %w", image.ErrInvalidName), "create", logrus.Fields{"disk": long}); e != syscall.ENAMETOOLONG {
		t.Errorf("too long a name: %v", e)
	}
	if e := v.toErrno(fmt.Errorf("create: %w", image.ErrInvalidName), "create", logrus.Fields{"disk": "a/b"}); e != syscall.EINVAL {
		t.Errorf("invalid name: %v", e)
	}
	hook.Reset()
	cases := []struct {
		err   error
		level logrus.Level
	}{
		{image.ErrNotExist, logrus.DebugLevel},
		{image.ErrNoSpace, logrus.WarnLevel},
		{syscall.EIO, logrus.ErrorLevel},
	}
	for _, c := range cases {
		hook.Reset()
		v.toErrno(c.err, "write", logrus.Fields{"disk": "d.raw", "offset": 4096})
		if len(hook.Entries) != 1 {
			t.Fatalf("%v: %d log entries, want 1", c.err, len(hook.Entries))
		}
		e := hook.LastEntry()
		if e.Level != c.level || e.Data["op"] != "write" || e.Data["disk"] != "d.raw" || e.Data["errno"] == nil || e.Data["offset"] != 4096 {
			t.Errorf("%v: logged %v %v", c.err, e.Level, e.Data)
		}
	}
	if e := v.toErrno(nil, "read", nil); e != 0 || len(hook.Entries) != 1 {
		t.Errorf("nil error: %v, %d entries", e, len(hook.Entries))
	}
}
