package tcgguest

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// File is one file of an initramfs.
type File struct {
	Name string // path in the guest, without a leading slash
	Mode uint32 // permission bits
	Data []byte
}

// Initramfs is what WriteInitramfs puts in the archive besides /init's
// basics: busybox as /bin/busybox (and /bin/sh), the modules in
// /lib/modules, and Files (their parent directories are made as needed).
type Initramfs struct {
	Busybox string   // a static busybox
	Modules []string // module files, put in /lib/modules
	Files   []File
}

// Write writes an uncompressed newc initramfs to out, with a /dev/console
// for init's first output.
func (in Initramfs) Write(out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	c := &cpioWriter{w: bufio.NewWriterSize(f, 1<<20), dirs: map[string]bool{}}
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "lib/modules"} {
		c.dir(d)
	}
	c.entry("dev/console", cpioChar|0o600, 5, 1, nil)
	bb, err := os.ReadFile(in.Busybox)
	if err != nil {
		return err
	}
	c.entry("bin/busybox", cpioReg|0o755, 0, 0, bb)
	c.entry("bin/sh", cpioLnk|0o777, 0, 0, []byte("busybox"))
	for _, m := range in.Modules {
		b, err := os.ReadFile(m)
		if err != nil {
			return err
		}
		c.entry("lib/modules/"+filepath.Base(m), cpioReg|0o644, 0, 0, b)
	}
	for _, file := range in.Files {
		c.dir(path.Dir(file.Name))
		c.entry(file.Name, cpioReg|file.Mode, 0, 0, file.Data)
	}
	if err := c.close(); err != nil {
		return fmt.Errorf("initramfs %s: %w", out, err)
	}
	return f.Close()
}

// lddLine is one library line of ldd's output: "name => /path (addr)" or
// "/path (addr)" (the loader).
var lddLine = regexp.MustCompile(`^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$`)

// Executable is a dynamically linked program and its libraries (ldd's
// closure, the dynamic loader included) as initramfs files, each at its
// host path, the program at guestPath. Files are read through symlinks.
func Executable(bin, guestPath string) ([]File, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	libs, err := parseLdd(string(out))
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var files []File
	add := func(host, guest string, mode uint32) error {
		b, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		files = append(files, File{Name: strings.TrimPrefix(guest, "/"), Mode: mode, Data: b})
		return nil
	}
	if err := add(bin, guestPath, 0o755); err != nil {
		return nil, err
	}
	for _, l := range libs {
		if err := add(l, l, 0o755); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// parseLdd returns the paths of ldd's output, in its order; the vDSO
// (no path) is skipped, a library ldd did not find is an error.
func parseLdd(out string) ([]string, error) {
	var libs []string
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("missing library: %s", strings.TrimSpace(line))
		}
		if m := lddLine.FindStringSubmatch(line); m != nil {
			libs = append(libs, m[1])
		}
	}
	if len(libs) == 0 {
		return nil, fmt.Errorf("no libraries in ldd's output (a static executable?)")
	}
	return libs, nil
}

// cpioWriter writes a newc ("070701") cpio archive, the format the kernel
// unpacks as an initramfs. Entries are owned by root, dated 0.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	err  error
	dirs map[string]bool // directories written
}

const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioLnk  = 0o120000
	cpioChar = 0o020000
)

// dir writes a directory entry for name and its parents, each once.
func (c *cpioWriter) dir(name string) {
	if name == "." || name == "/" || name == "" || c.dirs[name] {
		return
	}
	c.dir(path.Dir(name))
	c.dirs[name] = true
	c.entry(name, cpioDir|0o755, 0, 0, nil)
}

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
