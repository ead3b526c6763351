package telemetry

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/transfer"
)

// TestSendReceiveThroughSocket: a writable disk sent through the socket
// and received back through it as another disk, with the sender's mode
// and owner, or with those POST /receive's parameters give; a bad mode
// is refused.
func TestSendReceiveThroughSocket(t *testing.T) {
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	serveSource(t, src, mnt, "")
	var b bytes.Buffer
	if _, err := Send(mnt, "vm.raw", "", &b); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(mnt, "same.raw", bytes.NewReader(b.Bytes()), transfer.ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
	m, u, g := uint32(0o640), uint32(7), uint32(8)
	st, err := Receive(mnt, "mine.raw", bytes.NewReader(b.Bytes()), transfer.ReceiveOptions{Mode: &m, UID: &u, GID: &g})
	if err != nil || st.Size != 4<<20 {
		t.Fatalf("receive: %+v, %v", st, err)
	}
	for name, want := range map[string][3]uint32{"same.raw": {0o644, 0, 0}, "mine.raw": {0o640, 7, 8}} {
		info, err := src.s.Stat(name)
		if err != nil || info.Mode != want[0] || info.UID != want[1] || info.GID != want[2] {
			t.Errorf("%s: mode %#o %d:%d (%v), want %#o %d:%d", name, info.Mode, info.UID, info.GID, err, want[0], want[1], want[2])
		}
	}
	bad := uint32(0o4755)
	if _, err := Receive(mnt, "bad.raw", bytes.NewReader(b.Bytes()), transfer.ReceiveOptions{Mode: &bad}); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("a setuid mode: %v", err)
	}
	if l := src.s.List(); len(l) != 3 {
		t.Errorf("disks: %+v", l)
	}
}

// dyingSource is a mount whose daemon stops (its socket closes) in the
// middle of a send or a receive.
type dyingSource struct {
	storeSource
	stop func()
}

func (d dyingSource) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	w.Write(make([]byte, 1<<20)) // more than the response's buffer: the client gets some
	d.stop()
	return transfer.Stats{}, errors.New("stopped")
}

func (d dyingSource) Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	io.ReadFull(r, make([]byte, 64<<10))
	d.stop()
	return transfer.Stats{}, errors.New("stopped")
}

// TestTransferDaemonStopped: a send or receive whose daemon stops midway
// fails with ErrDaemonStopped and a message that says so, naming the
// mount; one to a mount nothing serves fails with ErrNotServing.
func TestTransferDaemonStopped(t *testing.T) {
	for _, what := range []string{"send", "receive"} {
		mnt := filepath.Join(t.TempDir(), "mnt")
		src := dyingSource{storeSource: newSource(t)}
		var once sync.Once
		var stop func()
		src.stop = func() { once.Do(stop) }
		var err error
		if stop, err = Serve(Handler(src, mnt, "store.img"), src, mnt, "", false); err != nil {
			t.Fatal(err)
		}
		if what == "send" {
			_, err = Send(mnt, "vm.raw", "", io.Discard)
		} else {
			_, err = Receive(mnt, "x.raw", bytes.NewReader(make([]byte, 16<<20)), transfer.ReceiveOptions{})
		}
		if !errors.Is(err, ErrDaemonStopped) || !strings.Contains(err.Error(), "the vdiskfs daemon serving "+mnt+" stopped during the "+what) {
			t.Errorf("%s: %v, want ErrDaemonStopped", what, err)
		}
		t.Logf("%s: %v", what, err)
		if _, err := Send(mnt, "vm.raw", "", io.Discard); !errors.Is(err, ErrNotServing) {
			t.Errorf("send after the daemon stopped: %v, want ErrNotServing", err)
		}
	}
}
