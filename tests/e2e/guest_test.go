package e2e

// The guest for TestVMWritesThroughVdiskfs: Debian's stock kernel (only
// the files we need, taken from its package without installing it),
// Debian's static busybox, and an initramfs written here in the newc cpio
// format. Downloads are cached under cacheRoot between runs.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// guestKernel is a cached kernel: the image, its release, and the modules
// the guest must load for a virtio-blk disk on PCI, in load order.
type guestKernel struct {
	pkg, release, vmlinuz string
	modules               []string // paths, dependencies first
}

// kernelModules maps the kernel options the guest needs to their modules.
var kernelModules = []struct{ option, module string }{
	{"CONFIG_VIRTIO_PCI", "virtio_pci"},
	{"CONFIG_VIRTIO_BLK", "virtio_blk"},
}

// cachedKernel returns the guest kernel from the cache, fetching Debian's
// linux-image-amd64 dependency (the current linux-image-6.x-amd64 package)
// with `apt-get download` the first time. The host's own kernel packages
// are never touched.
func cachedKernel(t *testing.T) *guestKernel {
	t.Helper()
	root := filepath.Join(cacheRoot(t), "kernel")
	if k := kernelInCache(root); k != nil {
		t.Logf("guest kernel %s (%s) from the cache %s", k.release, k.pkg, root)
		return k
	}
	needTools(t, "dpkg-deb:dpkg", "apt-get:apt", "apt-cache:apt")
	pkg := kernelPackage(t)
	start := time.Now()
	deb := aptDownload(t, pkg)
	k := extractKernel(t, deb, pkg, root)
	t.Logf("guest kernel %s: downloaded and extracted %s in %v into %s", k.release, pkg, time.Since(start).Round(time.Millisecond), root)
	return k
}

// kernelInCache returns the newest complete cache entry (its load-order
// file is written last), or nil.
func kernelInCache(root string) *guestKernel {
	orders, _ := filepath.Glob(filepath.Join(root, "*", "load-order"))
	sort.Strings(orders)
	for i := len(orders) - 1; i >= 0; i-- {
		dir := filepath.Dir(orders[i])
		order, err1 := os.ReadFile(orders[i])
		rel, err2 := os.ReadFile(filepath.Join(dir, "release"))
		vmlinuz := filepath.Join(dir, "vmlinuz")
		if err1 != nil || err2 != nil {
			continue
		}
		if _, err := os.Stat(vmlinuz); err != nil {
			continue
		}
		k := &guestKernel{pkg: filepath.Base(dir), release: strings.TrimSpace(string(rel)), vmlinuz: vmlinuz}
		ok := true
		for _, m := range strings.Fields(string(order)) {
			p := filepath.Join(dir, "modules", m)
			if _, err := os.Stat(p); err != nil {
				ok = false
				break
			}
			k.modules = append(k.modules, p)
		}
		if ok {
			return k
		}
	}
	return nil
}

// kernelPackage resolves linux-image-amd64 to the versioned package it
// depends on, running apt-get update once if the package lists lack it.
func kernelPackage(t *testing.T) string {
	t.Helper()
	for attempt := 0; attempt < 2; attempt++ {
		out, _ := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(strings.TrimLeft(strings.TrimSpace(line), "|"))
			if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") && !strings.HasPrefix(f[1], "<") {
				return f[1]
			}
		}
		aptUpdateOnce(t)
	}
	t.Fatal("apt-cache depends linux-image-amd64 names no linux-image-* package, even after apt-get update")
	return ""
}

// aptDownload fetches one package's .deb into a temporary directory.
func aptDownload(t *testing.T, pkg string) string {
	t.Helper()
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		cmd := exec.Command("apt-get", append(append([]string{}, aptArgs...), "download", "-qq", pkg)...)
		cmd.Dir, cmd.Env = dir, aptEnv()
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if attempt == 0 { // stale lists: update once and try again
			aptUpdateOnce(t)
			continue
		}
		t.Fatalf("apt-get download %s: %v\n%s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download %s left %v", pkg, debs)
	}
	return debs[0]
}

// walkDeb streams the data archive of a .deb through fn.
func walkDeb(t *testing.T, deb string, fn func(name string, hdr *tar.Header, r io.Reader) error) {
	t.Helper()
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("dpkg-deb: %v", err)
	}
	tr := tar.NewReader(bufio.NewReaderSize(out, 1<<20))
	var walkErr error
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			walkErr = err
			break
		}
		if err := fn(strings.TrimPrefix(path.Clean(hdr.Name), "./"), hdr, tr); err != nil {
			walkErr = err
			break
		}
	}
	io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil && walkErr == nil {
		walkErr = fmt.Errorf("%v: %s", err, stderr.String())
	}
	if walkErr != nil {
		t.Fatalf("reading %s: %v", filepath.Base(deb), walkErr)
	}
}

// extractKernel takes vmlinuz, the config and the virtio modules out of a
// linux-image .deb, works out which modules to load in which order from
// the config and each module's .modinfo, and stores them in the cache.
func extractKernel(t *testing.T, deb, pkg, root string) *guestKernel {
	t.Helper()
	var vmlinuz, config []byte
	release := ""
	raw := map[string][]byte{} // path in the package -> module file as shipped
	walkDeb(t, deb, func(name string, hdr *tar.Header, r io.Reader) error {
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		base := path.Base(name)
		switch {
		case strings.HasPrefix(name, "boot/vmlinuz-"):
			release = strings.TrimPrefix(base, "vmlinuz-")
			b, err := io.ReadAll(r)
			vmlinuz = b
			return err
		case strings.HasPrefix(name, "boot/config-"):
			b, err := io.ReadAll(r)
			config = b
			return err
		case strings.Contains(name, "lib/modules/") && strings.Contains(base, ".ko") &&
			(strings.Contains(name, "/kernel/drivers/virtio/") || strings.Contains(name, "/kernel/drivers/block/")):
			b, err := io.ReadAll(r)
			raw[name] = b
			return err
		}
		return nil
	})
	if vmlinuz == nil || config == nil {
		t.Fatalf("%s: no boot/vmlinuz-* or boot/config-* in the package", pkg)
	}

	// Which of the needed drivers are modules?
	var roots []string
	for _, km := range kernelModules {
		switch v := configValue(config, km.option); v {
		case "y":
			t.Logf("guest kernel %s: %s=y (built in)", release, km.option)
		case "m":
			t.Logf("guest kernel %s: %s=m: the initramfs loads %s", release, km.option, km.module)
			roots = append(roots, km.module)
		default:
			t.Fatalf("guest kernel %s: %s=%q: no virtio-blk disk possible", release, km.option, v)
		}
	}

	// Decompress, and read each module's name and dependencies.
	type mod struct {
		data []byte
		deps []string
	}
	mods := map[string]*mod{}
	for name := range raw {
		if strings.HasSuffix(name, ".ko.xz") {
			needTools(t, "xz:xz-utils")
		} else if strings.HasSuffix(name, ".ko.zst") {
			needTools(t, "zstd:zstd")
		}
	}
	for name, b := range raw {
		data, err := decompressModule(name, b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		info, err := modinfo(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		modName := info["name"]
		if modName == "" {
			modName = strings.ReplaceAll(strings.SplitN(path.Base(name), ".ko", 2)[0], "-", "_")
		}
		var deps []string
		for _, d := range strings.Split(info["depends"], ",") {
			if d = strings.TrimSpace(d); d != "" {
				deps = append(deps, strings.ReplaceAll(d, "-", "_"))
			}
		}
		mods[modName] = &mod{data: data, deps: deps}
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string)
	visit = func(name, from string) {
		switch state[name] {
		case 2:
			return
		case 1:
			t.Fatalf("module dependency cycle at %s", name)
		}
		m := mods[name]
		if m == nil {
			t.Fatalf("guest kernel %s: module %s (needed by %s) is not under drivers/virtio or drivers/block", release, name, from)
		}
		state[name] = 1
		for _, d := range m.deps {
			visit(d, name)
		}
		state[name] = 2
		order = append(order, name)
	}
	for _, r := range roots {
		visit(r, "the guest")
	}

	// Store: a temporary directory renamed into place, load-order last.
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(tmp, "vmlinuz"), vmlinuz, 0o644))
	must(os.WriteFile(filepath.Join(tmp, "release"), []byte(release+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(tmp, "config"), config, 0o644))
	must(os.Mkdir(filepath.Join(tmp, "modules"), 0o755))
	var files []string
	for _, name := range order {
		f := name + ".ko"
		must(os.WriteFile(filepath.Join(tmp, "modules", f), mods[name].data, 0o644))
		files = append(files, f)
	}
	must(os.WriteFile(filepath.Join(tmp, "load-order"), []byte(strings.Join(files, "\n")+"\n"), 0o644))
	final := filepath.Join(root, pkg)
	os.RemoveAll(final)
	must(os.Rename(tmp, final))
	k := kernelInCache(root)
	if k == nil || k.pkg != pkg {
		t.Fatalf("kernel cache %s unreadable after writing it", final)
	}
	return k
}

// configValue returns the value of one option in a kernel config ("y",
// "m", or "" when it is not set).
func configValue(config []byte, option string) string {
	for _, line := range strings.Split(string(config), "\n") {
		if v, ok := strings.CutPrefix(line, option+"="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// decompressModule undoes the compression of a .ko.xz, .ko.gz or .ko.zst.
func decompressModule(name string, b []byte) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(name, ".ko"):
		return b, nil
	case strings.HasSuffix(name, ".ko.gz"):
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(name, ".ko.xz"):
		tool = "xz"
	case strings.HasSuffix(name, ".ko.zst"):
		tool = "zstd"
	default:
		return nil, fmt.Errorf("unknown module compression")
	}
	cmd := exec.Command(tool, "-dc")
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc: %v (install %s)", tool, err, map[string]string{"xz": "xz-utils", "zstd": "zstd"}[tool])
	}
	return out, nil
}

// modinfo reads the key=value strings of a module's .modinfo section.
func modinfo(ko []byte) (map[string]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	info := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			if _, dup := info[k]; !dup {
				info[k] = v
			}
		}
	}
	return info, nil
}

// staticBusybox returns a statically linked busybox: the cached one, the
// host's if it is static, else Debian's busybox-static taken out of its
// package (downloaded, not installed).
func staticBusybox(t *testing.T) string {
	t.Helper()
	cached := filepath.Join(cacheRoot(t), "busybox", "busybox")
	if isStatic(cached) {
		return cached
	}
	if p, err := exec.LookPath("busybox"); err == nil && isStatic(p) {
		return p
	}
	needTools(t, "dpkg-deb:dpkg", "apt-get:apt")
	deb := aptDownload(t, "busybox-static")
	var bin []byte
	walkDeb(t, deb, func(name string, hdr *tar.Header, r io.Reader) error {
		if hdr.Typeflag == tar.TypeReg && path.Base(name) == "busybox" && strings.Contains(name, "bin/") {
			b, err := io.ReadAll(r)
			bin = b
			return err
		}
		return nil
	})
	if bin == nil {
		t.Fatal("busybox-static: no bin/busybox in the package")
	}
	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := cached + ".tmp"
	if err := os.WriteFile(tmp, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, cached); err != nil {
		t.Fatal(err)
	}
	if !isStatic(cached) {
		t.Fatalf("%s from busybox-static is not a static executable", cached)
	}
	t.Logf("busybox-static extracted into %s", cached)
	return cached
}

// isStatic reports whether path is an ELF executable without an
// interpreter (statically linked).
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}

// busyboxApplets lists the applets of a busybox binary.
func busyboxApplets(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		t.Fatalf("%s --list: %v", bin, err)
	}
	m := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		m[a] = true
	}
	return m
}

// --- initramfs: newc cpio ---------------------------------------------------

// cpioWriter writes a newc ("070701") cpio archive, the format the kernel
// unpacks as an initramfs. Entries are owned by root, dated 0.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	err error
}

const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioLnk  = 0o120000
	cpioChar = 0o020000
)

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if n%4 != 0 {
		c.write(make([]byte, 4-n%4))
	}
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}

// initramfsFile is one file of the initramfs.
type initramfsFile struct {
	name string // without a leading slash
	mode uint32 // permission bits
	data []byte
}

// writeInitramfs writes an uncompressed initramfs with busybox as
// /bin/busybox (and /bin/sh), a /dev/console for init's first output, the
// given modules in /lib/modules and the given files.
func writeInitramfs(t *testing.T, out, busybox string, modules []string, files []initramfsFile) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &cpioWriter{w: bufio.NewWriterSize(f, 1<<20)}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules"} {
		c.entry(d, cpioDir|0o755, 0, 0, nil)
	}
	c.entry("dev/console", cpioChar|0o600, 5, 1, nil)
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	c.entry("bin/busybox", cpioReg|0o755, 0, 0, bb)
	c.entry("bin/sh", cpioLnk|0o777, 0, 0, []byte("busybox"))
	for _, m := range modules {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		c.entry("lib/modules/"+filepath.Base(m), cpioReg|0o644, 0, 0, b)
	}
	for _, file := range files {
		c.entry(file.name, cpioReg|file.mode, 0, 0, file.data)
	}
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
