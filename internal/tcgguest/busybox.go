package tcgguest

import (
	"archive/tar"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Busybox returns a statically linked busybox: the cached one, the host's
// if it is static, else Debian's busybox-static taken out of its package
// (downloaded, not installed).
func (c *Cache) Busybox() (string, error) {
	cached := filepath.Join(c.Dir, "busybox", "busybox")
	if IsStatic(cached) {
		return cached, nil
	}
	if p, err := exec.LookPath("busybox"); err == nil && IsStatic(p) {
		return p, nil
	}
	tmpDir, err := os.MkdirTemp("", "tcgguest-busybox-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmpDir)
	deb, err := c.Apt.Download("busybox-static", tmpDir)
	if err != nil {
		return "", err
	}
	var bin []byte
	err = walkDeb(deb, func(name string, hdr *tar.Header, r io.Reader) error {
		if hdr.Typeflag == tar.TypeReg && path.Base(name) == "busybox" && strings.Contains(name, "bin/") {
			b, err := io.ReadAll(r)
			bin = b
			return err
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if bin == nil {
		return "", fmt.Errorf("busybox-static: no bin/busybox in the package")
	}
	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		return "", err
	}
	tmp := cached + ".tmp"
	if err := os.WriteFile(tmp, bin, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, cached); err != nil {
		return "", err
	}
	if !IsStatic(cached) {
		return "", fmt.Errorf("%s from busybox-static is not a static executable", cached)
	}
	c.logf("busybox-static extracted into %s", cached)
	return cached, nil
}

// IsStatic reports whether path is an ELF executable without an
// interpreter (statically linked).
func IsStatic(path string) bool {
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

// Applets lists the applets of a busybox binary.
func Applets(busybox string) (map[string]bool, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	m := map[string]bool{}
	for _, a := range strings.Fields(string(out)) {
		m[a] = true
	}
	return m, nil
}
