package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

// result is the outcome of one in-process run of the CLI.
type result struct {
	stdout, stderr string
	code           int
}

// vdisk runs the CLI in process with args.
func vdisk(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := vdisk(t, args...)
	if r.code != 0 {
		t.Fatalf("vdisk %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// wantFail runs the CLI and fails the test unless it exits with code and
// stderr contains every one of msgs.
func wantFail(t *testing.T, code int, msgs []string, args ...string) result {
	t.Helper()
	r := vdisk(t, args...)
	if r.code != code {
		t.Fatalf("vdisk %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	for _, m := range msgs {
		if !strings.Contains(r.stderr, m) {
			t.Fatalf("vdisk %s: stderr does not mention %q:\n%s", strings.Join(args, " "), m, r.stderr)
		}
	}
	return r
}

// newStore formats a fresh 64 MiB store in t.TempDir() (ext4, not tmpfs: the
// store uses O_DIRECT) and checks it when the test ends.
func newStore(t *testing.T, extra ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.img")
	mustRun(t, append([]string{"format", path, "--size", "64M"}, extra...)...)
	t.Cleanup(func() { checkStore(t, path) })
	return path
}

// checkStore fails the test if the store at path has any finding.
func checkStore(t *testing.T, path string) {
	t.Helper()
	s, err := image.OpenPath(path, image.Options{ReadOnly: true, Tolerant: true, CommitInterval: -1})
	if err != nil {
		t.Errorf("check %s: %v", path, err)
		return
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		t.Errorf("check %s: %v", path, rep.Findings)
	}
}

// lockStore opens the store read-write, as a mount would, until the test
// ends.
func lockStore(t *testing.T, path string) {
	t.Helper()
	s, err := image.OpenPath(path, image.Options{CommitInterval: -1, Program: "vdisk test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
}

// listDisks returns `vdisk ls --json`.
func listDisks(t *testing.T, store string) []lsEntry {
	t.Helper()
	var ds []lsEntry
	if err := json.Unmarshal([]byte(mustRun(t, "ls", "--json", store).stdout), &ds); err != nil {
		t.Fatal(err)
	}
	return ds
}

func diskByName(t *testing.T, store, name string) lsEntry {
	t.Helper()
	for _, d := range listDisks(t, store) {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no disk %q in %s", name, store)
	return lsEntry{}
}

func TestHelp(t *testing.T) {
	r := mustRun(t, "--help")
	for _, c := range []string{"format", "mount", "create", "ls", "info", "rm", "resize", "rename", "snapshot", "upgrade", "import", "export", "fsck", "defrag", "diff", "send", "receive", "--log-level", "Exit codes"} {
		if !strings.Contains(r.stdout, c) {
			t.Errorf("help does not mention %q:\n%s", c, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("stderr: %q", r.stderr)
	}
	if r := mustRun(t); !strings.Contains(r.stdout, "Available Commands") {
		t.Errorf("no arguments: want help, got %q", r.stdout)
	}
	if r := mustRun(t, "fsck", "--help"); !strings.Contains(r.stdout, "vdisk fsck STORE") {
		t.Errorf("fsck --help: %q", r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"ls"}, "takes 1 arguments (STORE), got 0"},
		{[]string{"create", "s"}, "takes 3 arguments"},
		{[]string{"rm", "s"}, "at least one disk name"},
		{[]string{"ls", "--nope", "s"}, "unknown flag: --nope"},
		{[]string{"create", "--mode", "999", "s", "a", "1"}, "octal"},
		{[]string{"format", "--size", "-1", "s"}, "negative"},
		{[]string{"--log-level", "loud", "ls", "s"}, "--log-level"},
	} {
		r := wantFail(t, exitFailure, []string{"vdisk: ", tc.msg}, tc.args...)
		if !strings.Contains(r.stderr, "Usage:") {
			t.Errorf("%v: no usage in stderr:\n%s", tc.args, r.stderr)
		}
	}
}

func TestOperationalErrorHasNoUsage(t *testing.T) {
	r := wantFail(t, exitFailure, []string{"vdisk: ", "no such file"}, "ls", filepath.Join(t.TempDir(), "missing.img"))
	if strings.Contains(r.stderr, "Usage:") {
		t.Errorf("usage printed for an operational error:\n%s", r.stderr)
	}
}

// TestLockedStore: every command refuses a store another process has open,
// and names the holder.
func TestLockedStore(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	src := filepath.Join(t.TempDir(), "src.raw")
	writeFile(t, src, []byte("data"))
	lockStore(t, store)
	dst := filepath.Join(t.TempDir(), "dst.raw")
	for _, args := range [][]string{
		{"format", "--force", store},
		{"create", store, "b.raw", "1M"},
		{"ls", store},
		{"info", store},
		{"rm", store, "a.raw"},
		{"resize", store, "a.raw", "2M"},
		{"rename", store, "a.raw", "b.raw"},
		{"snapshot", store, "a.raw", "b.raw"},
		{"upgrade", store},
		{"import", store, "b.raw", src},
		{"export", store, "a.raw", dst},
		{"fsck", store},
		{"fsck", "--repair", store},
		{"defrag", store},
		{"diff", store, "a.raw", "b.raw"},
		{"send", store, "a.raw"},
		{"receive", store, "c.raw", src},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := wantFail(t, exitFailure, []string{"locked", "vdisk test"}, args...)
			if strings.Contains(r.stderr, "Usage:") {
				t.Errorf("usage printed:\n%s", r.stderr)
			}
		})
	}
}
