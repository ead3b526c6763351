package tcgguest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// DefaultCacheDir is where downloads are kept between runs:
// $XDG_CACHE_HOME/vdiskfs-e2e, else /var/cache/vdiskfs-e2e.
func DefaultCacheDir() string {
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "vdiskfs-e2e")
	}
	return "/var/cache/vdiskfs-e2e"
}

// Cache fetches the guest's kernel and busybox once and keeps them in
// Dir.
type Cache struct {
	Dir  string
	Apt  *Apt
	Logf func(format string, args ...any) // progress lines; nil for none
}

func (c *Cache) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

// Kernel is a cached kernel: the image, its release, and the modules the
// guest must load for a virtio-blk disk on PCI, in load order.
type Kernel struct {
	Pkg, Release, Vmlinuz string
	Modules               []string // paths, dependencies first
}

// ModuleNames are the modules' names, in load order.
func (k *Kernel) ModuleNames() []string {
	var names []string
	for _, m := range k.Modules {
		names = append(names, strings.TrimSuffix(filepath.Base(m), ".ko"))
	}
	return names
}

// kernelModules maps the kernel options the guest needs to their modules.
var kernelModules = []struct{ option, module string }{
	{"CONFIG_VIRTIO_PCI", "virtio_pci"},
	{"CONFIG_VIRTIO_BLK", "virtio_blk"},
}

// Kernel returns the guest kernel from the cache, fetching Debian's
// linux-image-amd64 dependency (the current linux-image-6.x-amd64
// package) with `apt-get download` the first time. The host's own kernel
// packages are never touched. Fetching needs apt-get, apt-cache and
// dpkg-deb (and xz or zstd for compressed modules).
func (c *Cache) Kernel() (*Kernel, error) {
	root := filepath.Join(c.Dir, "kernel")
	if k := kernelInCache(root); k != nil {
		c.logf("guest kernel %s (%s) from the cache %s", k.Release, k.Pkg, root)
		return k, nil
	}
	pkg, err := c.Apt.kernelPackage()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	tmp, err := os.MkdirTemp("", "tcgguest-kernel-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	deb, err := c.Apt.Download(pkg, tmp)
	if err != nil {
		return nil, err
	}
	k, err := c.extractKernel(deb, pkg, root)
	if err != nil {
		return nil, fmt.Errorf("guest kernel from %s: %w", pkg, err)
	}
	c.logf("guest kernel %s: downloaded and extracted %s in %v into %s", k.Release, pkg, time.Since(start).Round(time.Millisecond), root)
	return k, nil
}

// kernelInCache returns the newest complete cache entry (its load-order
// file is written last), or nil.
func kernelInCache(root string) *Kernel {
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
		k := &Kernel{Pkg: filepath.Base(dir), Release: strings.TrimSpace(string(rel)), Vmlinuz: vmlinuz}
		ok := true
		for _, m := range strings.Fields(string(order)) {
			p := filepath.Join(dir, "modules", m)
			if _, err := os.Stat(p); err != nil {
				ok = false
				break
			}
			k.Modules = append(k.Modules, p)
		}
		if ok {
			return k
		}
	}
	return nil
}

// walkDeb streams the data archive of a .deb through fn.
func walkDeb(deb string, fn func(name string, hdr *tar.Header, r io.Reader) error) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb: %w", err)
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
		return fmt.Errorf("reading %s: %w", filepath.Base(deb), walkErr)
	}
	return nil
}

// extractKernel takes vmlinuz, the config and the virtio modules out of a
// linux-image .deb, works out which modules to load in which order from
// the config and each module's .modinfo, and stores them in the cache.
func (c *Cache) extractKernel(deb, pkg, root string) (*Kernel, error) {
	var vmlinuz, config []byte
	release := ""
	raw := map[string][]byte{} // path in the package -> module file as shipped
	err := walkDeb(deb, func(name string, hdr *tar.Header, r io.Reader) error {
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		base := path.Base(name)
		var err error
		switch {
		case strings.HasPrefix(name, "boot/vmlinuz-"):
			release = strings.TrimPrefix(base, "vmlinuz-")
			vmlinuz, err = io.ReadAll(r)
		case strings.HasPrefix(name, "boot/config-"):
			config, err = io.ReadAll(r)
		case strings.Contains(name, "lib/modules/") && strings.Contains(base, ".ko") &&
			(strings.Contains(name, "/kernel/drivers/virtio/") || strings.Contains(name, "/kernel/drivers/block/")):
			raw[name], err = io.ReadAll(r)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if vmlinuz == nil || config == nil {
		return nil, fmt.Errorf("no boot/vmlinuz-* or boot/config-* in the package")
	}

	// Which of the needed drivers are modules?
	var roots []string
	for _, km := range kernelModules {
		switch v := configValue(config, km.option); v {
		case "y":
			c.logf("guest kernel %s: %s=y (built in)", release, km.option)
		case "m":
			c.logf("guest kernel %s: %s=m: the initramfs loads %s", release, km.option, km.module)
			roots = append(roots, km.module)
		default:
			return nil, fmt.Errorf("guest kernel %s: %s=%q: no virtio-blk disk possible", release, km.option, v)
		}
	}

	// Decompress, and read each module's name and dependencies.
	type mod struct {
		data []byte
		deps []string
	}
	mods := map[string]*mod{}
	for name, b := range raw {
		data, err := decompressModule(name, b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		info, err := modinfo(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
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
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		}
		m := mods[name]
		if m == nil {
			return fmt.Errorf("guest kernel %s: module %s (needed by %s) is not under drivers/virtio or drivers/block", release, name, from)
		}
		state[name] = 1
		for _, d := range m.deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, name)
		return nil
	}
	for _, r := range roots {
		if err := visit(r, "the guest"); err != nil {
			return nil, err
		}
	}

	// Store: a temporary directory renamed into place, load-order last.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	write := func(name string, data []byte) error {
		return os.WriteFile(filepath.Join(tmp, name), data, 0o644)
	}
	errs := []error{
		os.Chmod(tmp, 0o755),
		write("vmlinuz", vmlinuz),
		write("release", []byte(release+"\n")),
		write("config", config),
		os.Mkdir(filepath.Join(tmp, "modules"), 0o755),
	}
	var files []string
	for _, name := range order {
		f := name + ".ko"
		errs = append(errs, write(filepath.Join("modules", f), mods[name].data))
		files = append(files, f)
	}
	errs = append(errs, write("load-order", []byte(strings.Join(files, "\n")+"\n")))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	final := filepath.Join(root, pkg)
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	k := kernelInCache(root)
	if k == nil || k.Pkg != pkg {
		return nil, fmt.Errorf("kernel cache %s unreadable after writing it", final)
	}
	return k, nil
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
