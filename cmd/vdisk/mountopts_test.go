package main

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// mount.fuse3 runs "vdisk STORE MNT -o OPTS"; that, and only that, becomes
// vdisk mount.
func TestMountHelperArgs(t *testing.T) {
	root := newRootCmd(newEnv(io.Discard, io.Discard, false))
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"/s.img", "/mnt", "-o", "dev,suid"}, []string{"mount", "/s.img", "/mnt", "-o", "dev,suid"}},
		{[]string{"ls", "/mnt", "-o", "x"}, nil},          // a command
		{[]string{"/s.img", "/mnt"}, nil},                 // no -o: not mount.fuse3
		{[]string{"-x", "/mnt", "-o", "x"}, nil},          // a flag
		{[]string{"/s.img", "/mnt", "-o", "a", "b"}, nil}, // more than mount.fuse3 passes
		{[]string{"/s.img", "/mnt", "--json", "a"}, nil},  // not -o
		{[]string{"mount", "/s.img", "/mnt", "-o", "a"}, nil},
	} {
		got, ok := mountHelperArgs(root, tc.args)
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("mountHelperArgs(%q) = %q, %v; want %q", tc.args, got, ok, tc.want)
		}
	}
}

// The options fstab users write map onto vdisk mount's flags; mount(8)'s
// and systemd's own options are accepted and ignored; ro and unknown
// options are refused.
func TestApplyMountOptions(t *testing.T) {
	e := newEnv(io.Discard, io.Discard, false)
	var f mountFlags
	err := applyMountOptions(e, &f, "rw,dev,suid,nofail,_netdev,x-systemd.requires=local-fs.target,x-systemd.before=libvirtd.service,"+
		"allow_other,commit_interval=2s,metrics=127.0.0.1:9477,log_file=/var/log/v.log,log_level=info,log_format=json,fuse_transport=dev,io_engine=pread,socket_group=kvm,vhost_user_dir=/run/vm,debug")
	if err != nil {
		t.Fatal(err)
	}
	want := mountFlags{allowOther: true, debug: true, commitInterval: 2 * time.Second, metricsAddr: "127.0.0.1:9477",
		logFile: "/var/log/v.log", fuseTransport: "dev", ioEngine: "pread", socketGroup: "kvm", vhostUserDir: "/run/vm"}
	if !equalFlags(f, want) {
		t.Errorf("flags %+v, want %+v", f, want)
	}
	if e.log.GetLevel() != logrus.InfoLevel || e.logFormat != "json" {
		t.Errorf("log level %v format %s", e.log.GetLevel(), e.logFormat)
	}
	if err := applyMountOptions(e, &f, "commit_interval=7"); err != nil || f.commitInterval != 7*time.Second {
		t.Errorf("commit_interval=7: %v, %v", err, f.commitInterval)
	}
	for opts, msg := range map[string]string{
		"ro":                 "no read-only mount",
		"bogus":              "unknown mount option",
		"bogus=1":            "unknown mount option",
		"commit_interval=xx": "commit_interval",
		"log_format=xml":     "--log-format",
	} {
		err := applyMountOptions(e, &f, opts)
		var ue usageError
		if err == nil || !strings.Contains(err.Error(), msg) || !errors.As(err, &ue) {
			t.Errorf("-o %s: %v, want a usage error about %q", opts, err, msg)
		}
	}
}

func equalFlags(a, b mountFlags) bool {
	a.options, b.options = nil, nil
	return a.allowOther == b.allowOther && a.debug == b.debug && a.commitInterval == b.commitInterval &&
		a.metricsAddr == b.metricsAddr && a.logFile == b.logFile && a.fuseTransport == b.fuseTransport && a.ioEngine == b.ioEngine &&
		a.socketGroup == b.socketGroup && a.vhostUserDir == b.vhostUserDir
}

// -o reaches vdisk mount through the whole command line: a bad option is a
// usage error before anything is opened.
func TestMountOptionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"/nonexistent.img", t.TempDir(), "-o", "allow_other,bogus"}, &out, &errb)
	if code != exitFailure || !strings.Contains(errb.String(), "-o bogus: unknown mount option") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}
