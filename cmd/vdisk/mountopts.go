package main

// mount(8) and /etc/fstab.
//
// vdiskfs mounts from fstab and `mount -t fuse.vdisk STORE MNT` through
// fuse3's generic helper mount.fuse3 (/sbin/mount.fuse, which mount(8) runs
// for any fuse.TYPE): it strips "fuse." from the type and runs
//
//	/bin/sh -c 'vdisk STORE MNT -o OPTIONS'
//
// (libfuse util/mount.fuse.c). It drops the options that only mount(8) or
// systemd use (user, nofail, auto, noauto, _netdev, ...), handles setuid=
// and drop_privileges itself, and adds "dev,suid" unless nodev or nosuid
// was given, so OPTIONS is never empty. run turns that command line into
// `vdisk mount STORE MNT -o OPTIONS`, and mountOptions maps OPTIONS onto the
// flags of vdisk mount.

import (
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// mountHelperArgs recognises the command line mount.fuse3 runs, "STORE
// MOUNTPOINT -o OPTIONS" with STORE not a vdisk command, and returns the
// vdisk mount command line it means. Anything else is left alone.
func mountHelperArgs(root *cobra.Command, args []string) ([]string, bool) {
	if len(args) != 4 || args[2] != "-o" || args[0] == "" || strings.HasPrefix(args[0], "-") {
		return nil, false
	}
	if c, _, err := root.Find(args[:1]); err == nil && c != root {
		return nil, false // a real command, e.g. "vdisk ls X -o Y": let it fail as usual
	}
	return append([]string{"mount"}, args...), true
}

// ignoredMountOptions are options mount(8), systemd or the kernel's generic
// mount code mean, which vdisk mount accepts and does not act on: vdiskfs
// mounts are always nodev,nosuid-like FUSE mounts with default_permissions.
var ignoredMountOptions = map[string]bool{
	"defaults": true, "rw": true, "auto": true, "noauto": true, "nofail": true, "_netdev": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"dev": true, "nodev": true, "suid": true, "nosuid": true, "exec": true, "noexec": true,
	"atime": true, "noatime": true, "relatime": true, "norelatime": true, "strictatime": true,
	"nodiratime": true, "diratime": true, "lazytime": true, "nolazytime": true,
	"async": true, "default_permissions": true,
}

// applyMountOptions sets f from a mount(8)-style option list ("a,b=c,...").
// It maps
//
//	allow_other               --allow-other
//	debug                     --debug
//	commit_interval=DURATION  --commit-interval (5s, 1m, ...; a bare number is seconds)
//	metrics=ADDR              --metrics
//	socket_group=GROUP        --socket-group
//	vhost_user_dir=DIR        --vhost-user-dir
//	log_file=PATH             --log-file
//	log_level=LEVEL           --log-level
//	log_format=text|json      --log-format
//	fuse_transport=T          --fuse-transport
//	io_engine=E               --io-engine
//
// accepts (and ignores) x-systemd.*, x-*, comment=* and the generic options
// in ignoredMountOptions, and refuses ro and anything unknown.
func applyMountOptions(e *env, f *mountFlags, opts string) error {
	for _, o := range strings.Split(opts, ",") {
		key, val, hasVal := strings.Cut(o, "=")
		switch {
		case o == "" || ignoredMountOptions[o]:
			continue
		case strings.HasPrefix(key, "x-") || key == "comment":
			continue // userspace options: systemd-fstab-generator's x-systemd.*, and others'
		case o == "ro":
			return usageErrorf("-o ro: vdiskfs has no read-only mount")
		case o == "allow_other":
			f.allowOther = true
		case o == "debug":
			f.debug = true
		case !hasVal:
			return usageErrorf("-o %s: unknown mount option", o)
		case key == "commit_interval":
			d, err := parseDurationOrSeconds(val)
			if err != nil {
				return usageErrorf("-o commit_interval=%s: %v", val, err)
			}
			f.commitInterval = d
		case key == "metrics":
			f.metricsAddr = val
		case key == "socket_group":
			f.socketGroup = val
		case key == "vhost_user_dir":
			f.vhostUserDir = val
		case key == "log_file":
			f.logFile = val
		case key == "log_level":
			lvl, err := parseLogLevel(val)
			if err != nil {
				return err
			}
			e.log.SetLevel(lvl)
		case key == "log_format":
			if err := e.setLogFormat(val); err != nil {
				return err
			}
		case key == "fuse_transport":
			f.fuseTransport = val
		case key == "io_engine":
			f.ioEngine = val
		default:
			return usageErrorf("-o %s: unknown mount option", o)
		}
	}
	return nil
}

// parseDurationOrSeconds parses a Go duration ("5s", "1m30s") or a bare
// number of seconds, as fstab users write it.
func parseDurationOrSeconds(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	return time.ParseDuration(s + "s")
}
