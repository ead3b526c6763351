package telemetry

import (
	"errors"
	"io"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// A flush that fails makes the store refuse writes (image.ErrFailed), and
// vdiskfs_store_failed goes 0 → 1.
func TestStoreFailedGauge(t *testing.T) {
	dev := backend.NewCrash(64 << 20)
	if err := image.Format(dev, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	s, err := image.Open(dev, image.Options{CommitInterval: -1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	src := storeSource{s: s}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(src))
	if got := gathered(t, reg, "vdiskfs_store_failed", ""); got != 0 {
		t.Fatalf("vdiskfs_store_failed = %v on a healthy store", got)
	}
	if _, err := s.Create("vm.raw", 0, image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("vm.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.WriteAt(directio.AlignedBlock(1<<20), 0); err != nil {
		t.Fatal(err)
	}
	dev.SetFault(func(op backend.Op) error {
		if op.Kind == backend.OpFlush {
			return syscall.EIO
		}
		return nil
	})
	if err := s.Commit(); !errors.Is(err, image.ErrFailed) {
		t.Fatalf("commit with failing flushes: %v, want ErrFailed", err)
	}
	if got := gathered(t, reg, "vdiskfs_store_failed", ""); got != 1 {
		t.Fatalf("vdiskfs_store_failed = %v after the store failed", got)
	}
}
