package e2e

// The guest of the VM tests: package tcgguest's kernel, busybox and
// initramfs, with downloads cached in cacheRoot between runs.

import (
	"os"
	"testing"

	"github.com/vdiskfs/vdiskfs/internal/tcgguest"
)

// cacheRoot is where downloads (the guest kernel, busybox) are kept
// between runs: tcgguest.DefaultCacheDir.
func cacheRoot(t *testing.T) string {
	t.Helper()
	dir := tcgguest.DefaultCacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("cache directory: %v", err)
	}
	return dir
}

// guestCache is the download cache, logging to t.
func guestCache(t *testing.T) *tcgguest.Cache {
	return &tcgguest.Cache{Dir: cacheRoot(t), Apt: &apt, Logf: t.Logf}
}

// cachedKernel returns the guest kernel, fetched the first time (see
// tcgguest.Cache.Kernel).
func cachedKernel(t *testing.T) *tcgguest.Kernel {
	t.Helper()
	needTools(t, "dpkg-deb:dpkg", "apt-get:apt", "apt-cache:apt")
	k, err := guestCache(t).Kernel()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// staticBusybox returns a statically linked busybox (see
// tcgguest.Cache.Busybox).
func staticBusybox(t *testing.T) string {
	t.Helper()
	needTools(t, "dpkg-deb:dpkg", "apt-get:apt")
	bb, err := guestCache(t).Busybox()
	if err != nil {
		t.Fatal(err)
	}
	return bb
}

// busyboxApplets lists the applets of a busybox binary.
func busyboxApplets(t *testing.T, bin string) map[string]bool {
	t.Helper()
	m, err := tcgguest.Applets(bin)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
