package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"

	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

// --- Ceph RBD (--rbd-pool): librbd itself, and stores on RBD images ---

// targetLibRBD is fio's rbd engine on an image of --rbd-pool: librbd's
// asynchronous API with no FUSE and no mapping, the raw side of a store
// on RBD.
const targetLibRBD = "librbd"

// checkRBD refuses what --rbd-pool cannot measure: the librbd target
// without a pool, and with a pool the targets whose store is a file of
// this process (vdiskfs, vdiskfs-encrypted) or a guest's. It needs the
// rbd command, which finds the cluster as librbd does (CEPH_CONF, else
// /etc/ceph/ceph.conf).
func checkRBD(pool string, targets []string) error {
	if pool == "" {
		if slices.Contains(targets, targetLibRBD) {
			return fmt.Errorf("--targets %s needs --rbd-pool POOL", targetLibRBD)
		}
		return nil
	}
	for _, t := range targets {
		if t == targetVdiskfs || t == targetEncrypted || slices.Contains(guestTargets, t) {
			return fmt.Errorf("--rbd-pool: target %s keeps its store in a file; measure stores on RBD with --binary NAME=PATH (a vdisk built with make build TAGS=rbd)", t)
		}
	}
	if _, err := exec.LookPath("rbd"); err != nil {
		return fmt.Errorf("%w: --rbd-pool needs the rbd command (apt-get install ceph-common; tools/ceph/cluster.sh start runs a one-node cluster): %v", errMissing, err)
	}
	return nil
}

// rbdImage is an RBD image the tool creates and removes with the rbd
// command.
type rbdImage struct{ pool, name string }

// newRBDImage names the image of target in pool, after this process so
// that two runs on one cluster do not meet.
func newRBDImage(pool, target string) rbdImage {
	return rbdImage{pool: pool, name: fmt.Sprintf("compare-%s-%d", target, os.Getpid())}
}

func (i rbdImage) spec() string { return i.pool + "/" + i.name }

// create makes the image, thin, with librbd's cache off in the image's
// own configuration, so that fio's rbd engine writes through as vdisk's
// RBD backend does.
func (i rbdImage) create(ctx context.Context, size int64) error {
	if err := runCommand(ctx, "rbd", "create", "--size", fmt.Sprintf("%dM", size>>20), i.spec()); err != nil {
		return err
	}
	if err := runCommand(ctx, "rbd", "config", "image", "set", i.spec(), "rbd_cache", "false"); err != nil {
		return errors.Join(err, i.remove())
	}
	return nil
}

func (i rbdImage) remove() error {
	return runCommand(context.Background(), "rbd", "rm", "--no-progress", i.spec())
}

// librbdTarget is fio's rbd engine on an image of its own.
type librbdTarget struct {
	img  rbdImage
	size int64
}

func newLibRBD(ctx context.Context, pool string, size int64) (*librbdTarget, error) {
	t := &librbdTarget{img: newRBDImage(pool, targetLibRBD), size: size}
	if err := t.img.create(ctx, size); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *librbdTarget) Name() string { return targetLibRBD }

// File is "": fio reaches the image through its engine (FioPlace), and
// there is nothing to fsync (with the cache off, librbd completes a
// write once the OSDs have it).
func (t *librbdTarget) File() string { return "" }

// FioPlace is fio's rbd engine on the image, as the client admin; direct
// is off because the engine has no page cache to bypass.
func (t *librbdTarget) FioPlace() fio.Place {
	return fio.Place{Engine: []string{"ioengine=rbd", "clientname=admin", "pool=" + t.img.pool, "rbdname=" + t.img.name, "direct=0"}}
}

// Reset makes the image anew: empty and thin, its size unchanged.
func (t *librbdTarget) Reset(ctx context.Context) error {
	if err := t.img.remove(); err != nil {
		return err
	}
	return t.img.create(ctx, t.size)
}

// Sample is empty: librbd runs in fio, whose CPU is fio's column.
func (t *librbdTarget) Sample() sample { return sample{} }

func (t *librbdTarget) Close() error { return t.img.remove() }
