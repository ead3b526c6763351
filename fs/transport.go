package fs

import (
	"fmt"
	"os"
	"reflect"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/fs/fuseuring"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Transport is how requests travel between the kernel and the server.
type Transport string

const (
	// TransportAuto uses io_uring when the kernel offers it (as root,
	// PrepareTransport turns the fuse module's enable_uring on), else
	// /dev/fuse.
	TransportAuto Transport = ""
	// TransportIOURing requires FUSE-over-io_uring (PrepareTransport turns
	// the fuse module's enable_uring parameter on if it is off, which needs
	// root).
	TransportIOURing Transport = "io_uring"
	// TransportDev is read(2) and writev(2) on /dev/fuse.
	TransportDev Transport = "dev"
)

// ParseTransport reads a --fuse-transport value.
func ParseTransport(s string) (Transport, error) {
	switch s {
	case "auto", "":
		return TransportAuto, nil
	case string(TransportIOURing), string(TransportDev):
		return Transport(s), nil
	}
	return "", fmt.Errorf("unknown FUSE transport %q (want auto, io_uring or dev)", s)
}

// PrepareTransport readies the kernel for mounts with transport t: for
// io_uring it turns the fuse module's enable_uring parameter on (which
// needs root), failing if it cannot; for auto it does so when it may
// (root), since the parameter only lets servers ask for io_uring. It is
// the only function here that changes the system: a program calls it once,
// before StoreEngine and Mount, which only look (cmd/vdisk's mount does).
func PrepareTransport(t Transport) error {
	switch t {
	case TransportIOURing:
		return fuseuring.Enable()
	case TransportAuto:
		if fuseuring.Available() != nil && os.Geteuid() == 0 {
			_ = fuseuring.Enable() // auto falls back to /dev/fuse, and Mount logs why
		}
	}
	return nil
}

// wantIOURing says whether Mount asks the kernel for io_uring with
// transport t, and why not when it does not. It only looks.
func wantIOURing(t Transport) (bool, error) {
	if t == TransportDev {
		return false, fmt.Errorf("--fuse-transport=dev")
	}
	err := fuseuring.Available()
	return err == nil, err
}

// StoreEngine is the I/O engine to open a store with that will be mounted
// with transport t, when the operator chose engine (auto by default): over
// FUSE-over-io_uring, reads are plain preads issued by the request's
// handler: the request already arrives on a ring, and a backend io_uring
// would add a second hand-off to another thread per read, which made small
// random reads slower. It only looks: call PrepareTransport first, so that
// it sees what Mount will.
func StoreEngine(t Transport, engine backend.Engine) backend.Engine {
	if engine != backend.EngineAuto {
		return engine
	}
	if ok, _ := wantIOURing(t); ok {
		return backend.EnginePread
	}
	return engine
}

// startIOURing moves the connection of srv onto FUSE-over-io_uring queues
// served by a ProtocolServer over raw (the same file system srv serves).
func startIOURing(srv *fuse.Server, raw fuse.RawFileSystem, mo *fuse.MountOptions, o fuseuring.Options) (*fuseuring.Transport, error) {
	if srv.KernelSettings().Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		return nil, fmt.Errorf("the kernel did not offer io_uring in INIT")
	}
	ps := fuse.NewProtocolServer(raw, mo)
	if err := fuseuring.InitProtocolServer(ps, srv.KernelSettings()); err != nil {
		return nil, err
	}
	fd, err := serverFD(srv)
	if err != nil {
		return nil, err
	}
	return fuseuring.Start(fd, ps, o)
}

// serverFD returns a duplicate of the /dev/fuse descriptor go-fuse serves.
// go-fuse does not export it; TestFUSETransport fails if a go-fuse upgrade
// moves it, and Mount then falls back to /dev/fuse with the reason logged.
func serverFD(srv *fuse.Server) (int, error) {
	ffd := reflect.ValueOf(srv).Elem().FieldByName("fuseFD")
	if !ffd.IsValid() || ffd.Kind() != reflect.Pointer || ffd.IsNil() {
		return -1, fmt.Errorf("go-fuse Server has no fuseFD field")
	}
	fv := ffd.Elem().FieldByName("file")
	if !fv.IsValid() || fv.Type() != reflect.TypeOf((*os.File)(nil)) || fv.IsNil() {
		return -1, fmt.Errorf("go-fuse fuseFD has no file field")
	}
	file := (*os.File)(fv.UnsafePointer())
	rc, err := file.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("/dev/fuse descriptor: %w", err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(raw uintptr) { fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, fmt.Errorf("/dev/fuse descriptor: %w", err)
	}
	if derr != nil {
		return -1, fmt.Errorf("dup /dev/fuse: %w", derr)
	}
	return fd, nil
}
