package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// gendocs writes one man page per visible command and the three completion
// scripts; man -l renders a page without warnings.
func TestGendocs(t *testing.T) {
	dir := t.TempDir()
	mustRun(t, "gendocs", dir)
	for _, c := range []string{"", "-format", "-mount", "-umount", "-create", "-ls", "-info", "-rm", "-resize", "-rename",
		"-snapshot", "-upgrade", "-import", "-export", "-fsck", "-defrag", "-diff", "-send", "-receive", "-stats", "-vhost-user", "-version"} {
		page := filepath.Join(dir, "man", "man1", "vdisk"+c+".1")
		b, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("no man page: %v", err)
			continue
		}
		if !bytes.Contains(b, []byte(".TH ")) || bytes.Contains(b, []byte("Auto generated")) {
			t.Errorf("%s: not a reproducible man page:\n%.300s", page, b)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "man", "man1", "vdisk-gendocs.1")); err == nil {
		t.Error("the hidden gendocs command got a man page")
	}
	for name, want := range map[string]string{
		"vdisk.bash": "__start_vdisk",
		"_vdisk":     "#compdef vdisk",
		"vdisk.fish": "complete -c vdisk",
	} {
		b, err := os.ReadFile(filepath.Join(dir, "completion", name))
		if err != nil || !bytes.Contains(b, []byte(want)) {
			t.Errorf("completion %s: %v, lacks %q", name, err, want)
		}
	}

	man, err := exec.LookPath("man")
	if err != nil {
		testutil.Missing(t, "no man(1) here (tools/test.sh installs man-db)")
	}
	cmd := exec.Command(man, "--warnings", "-l", filepath.Join(dir, "man", "man1", "vdisk-mount.1"))
	cmd.Env = append(os.Environ(), "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("man -l vdisk-mount.1: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"VDISK-MOUNT(1)", "NAME", "vdisk-mount - Mount a store", "SYNOPSIS", "allow_other", "SEE ALSO"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rendered page lacks %q:\n%s", want, out)
		}
	}
}
