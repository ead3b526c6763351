package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestFsckFixtureExitCodes runs vdisk fsck, then fsck --repair, then fsck
// again on every damaged-store fixture of testdata/fsck (made and described
// by image/fixtures_test.go) and asserts the exit codes: what each damage
// class reports, that repair fixes it, and that the store is clean after.
func TestFsckFixtureExitCodes(t *testing.T) {
	cases := []struct {
		fixture string
		check   int // vdisk fsck
		repair  int // vdisk fsck --repair
		finding string
	}{
		{"clean", exitOK, exitOK, ""},
		{"torn-journal-tail", exitOK, exitOK, ""},
		{"superblock-copy-bad", exitUncorrected, exitRepaired, "superblock-copy"},
		{"journal-broken", exitUncorrected, exitRepaired, "journal-broken"},
		{"extent-outside-data", exitUncorrected, exitRepaired, "extent-outside-data"},
		{"shared-block", exitUncorrected, exitRepaired, "shared-block"},
		{"extent-beyond-size", exitUncorrected, exitRepaired, "extent-beyond-size"},
		{"leak", exitLeaks, exitRepaired, "leaked-blocks"},
		{"used-block-free", exitUncorrected, exitRepaired, "used-block-free"},
		{"invalid-name", exitUncorrected, exitRepaired, "invalid-name"},
		{"duplicate-name", exitUncorrected, exitRepaired, "duplicate-name"},
		// Version 2, with a snapshot and a clone: a count above the users
		// is a leak (exit 2), below them fatal (exit 4).
		{"shared-clean", exitOK, exitOK, ""},
		{"refcount-high", exitLeaks, exitRepaired, "refcount-high"},
		{"refcount-low", exitUncorrected, exitRepaired, "refcount-low"},
	}
	for _, c := range cases {
		t.Run(c.fixture, func(t *testing.T) {
			store := unpackFixture(t, c.fixture)
			res, code := fsckJSON(t, store)
			if code != c.check {
				t.Fatalf("fsck: exit %d, want %d; findings %+v", code, c.check, res.Findings)
			}
			if c.finding != "" && !hasCode(res, c.finding) {
				t.Fatalf("fsck: findings %+v lack %s", res.Findings, c.finding)
			}
			res, code = fsckJSON(t, store, "--repair")
			if code != c.repair {
				t.Fatalf("fsck --repair: exit %d, want %d; %+v", code, c.repair, res)
			}
			if _, code := fsckJSON(t, store); code != exitOK {
				t.Fatalf("fsck after repair: exit %d, want 0", code)
			}
		})
	}
}

func hasCode(res fsckResult, code string) bool {
	for _, f := range res.Findings {
		if f.Code == code {
			return true
		}
	}
	return false
}

// unpackFixture gunzips testdata/fsck/NAME.img.gz into a store file in
// t.TempDir() (ext4: the store is opened with O_DIRECT).
func unpackFixture(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "testdata", "fsck", name+".img.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".img")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, zr); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
