package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// --- a vdiskfs daemon of a given vdisk binary (--binary NAME=PATH) ---

// binarySpec is one --binary or --vhost-binary flag: a target called Name
// served by the vdisk binary at Path, on its mount or, with Vhost, on a
// vhost-user-blk socket (`vdisk vhost-user`).
type binarySpec struct {
	Name, Path string
	Vhost      bool
}

// parseBinary reads NAME=PATH, the value of flag (--binary or
// --vhost-binary). NAME becomes a target name, so it may not be one of the
// built-in targets.
func parseBinary(flag, s string) (binarySpec, error) {
	name, path, ok := strings.Cut(s, "=")
	name, path = strings.TrimSpace(name), strings.TrimSpace(path)
	if !ok || name == "" || path == "" {
		return binarySpec{}, fmt.Errorf("%s %q: want NAME=PATH (for example old=/tmp/vdisk-old)", flag, s)
	}
	if strings.ContainsAny(name, ", \t/") {
		return binarySpec{}, fmt.Errorf("%s %q: NAME may not contain commas, spaces or slashes", flag, s)
	}
	for _, t := range allTargets {
		if name == t || name == "qsd" {
			return binarySpec{}, fmt.Errorf("%s %q: %s is a built-in target's name", flag, s, name)
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return binarySpec{}, err
	}
	if st, err := os.Stat(abs); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return binarySpec{}, fmt.Errorf("%s %q: %s is not an executable file", flag, s, abs)
	}
	return binarySpec{Name: name, Path: abs, Vhost: flag == "--vhost-binary"}, nil
}

// vdiskDaemon is a fresh store that the binary formats and mounts as a
// user runs it (`vdisk mount STORE MNT`: the daemon in the background, its
// default options), with the test disk in it. The store is a file in the
// scratch directory, or with --rbd-pool an RBD image of that pool. Its
// counters and CPU come from `vdisk stats --json`, as for --mount; Close
// unmounts with `vdisk umount`, which returns once the daemon has closed
// the store.
type vdiskDaemon struct {
	*vdiskfsMount
	name, bin string
	img       *rbdImage // the store's RBD image, removed by Close; nil for a file
}

func newVdiskDaemon(ctx context.Context, spec binarySpec, dir, rbdPool string, size int64) (d *vdiskDaemon, err error) {
	store := filepath.Join(dir, spec.Name+".store")
	mnt := filepath.Join(dir, "mnt-"+spec.Name)
	run := func(args ...string) error { return runCommand(ctx, spec.Path, args...) }
	var img *rbdImage
	if rbdPool != "" {
		i := newRBDImage(rbdPool, spec.Name)
		img, store = &i, "rbd:"+i.spec()
	}
	// Thin, with room for one disk and the blocks a reset frees before
	// its commit, as for the in-process store.
	if err := run("format", store, "--size", fmt.Sprint(2*size+256<<20)); err != nil {
		return nil, err
	}
	if img != nil {
		defer func() {
			if err != nil {
				err = errors.Join(err, img.remove())
			}
		}()
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	if err := run("mount", store, mnt); err != nil {
		return nil, err
	}
	m, err := newVdiskfsMount(mnt, size, spec.Path, 0)
	if err != nil {
		return nil, errors.Join(err, run("umount", mnt))
	}
	return &vdiskDaemon{vdiskfsMount: m, name: spec.Name, bin: spec.Path, img: img}, nil
}

func (t *vdiskDaemon) Name() string { return t.name }

// Close removes the disk and unmounts; a store on RBD is removed too, one
// in a file stays for the caller to remove with the rest of the scratch
// files.
func (t *vdiskDaemon) Close() error {
	err := t.vdiskfsMount.Close()
	uerr := runCommand(context.Background(), t.bin, "umount", t.mnt)
	if t.img != nil && uerr == nil { // the image of a mounted store stays locked
		uerr = t.img.remove()
	}
	return errors.Join(err, uerr)
}

// runCommand runs bin with args; when it fails, the error names the
// command and carries its output.
func runCommand(ctx context.Context, bin string, args ...string) error {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
