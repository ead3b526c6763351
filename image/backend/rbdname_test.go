package backend

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseRBDName(t *testing.T) {
	for _, c := range []struct {
		in   string
		want RBDName
		str  string // String(), when not in
	}{
		{in: "rbd:rbd/store", want: RBDName{Pool: "rbd", Image: "store"}},
		{in: "rbd:pool/ns/img", want: RBDName{Pool: "pool", Namespace: "ns", Image: "img"}},
		{in: "rbd:p/i:id=vdisk:conf=/etc/ceph/c.conf", want: RBDName{Pool: "p", Image: "i", User: "vdisk", Conf: "/etc/ceph/c.conf"}},
		{in: "rbd:p/i:user=u", want: RBDName{Pool: "p", Image: "i", User: "u"}, str: "rbd:p/i:id=u"},
		{in: `rbd:p/i:mon_host=[v2\:10.0.0.1\:3300]:conf=/a\\b`, want: RBDName{Pool: "p", Image: "i", Conf: `/a\b`,
			Options: [][2]string{{"mon_host", "[v2:10.0.0.1:3300]"}}}, str: `rbd:p/i:conf=/a\\b:mon_host=[v2\:10.0.0.1\:3300]`},
	} {
		got, err := ParseRBDName(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseRBDName(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		str := c.str
		if str == "" {
			str = c.in
		}
		if got.String() != str {
			t.Errorf("ParseRBDName(%q).String() = %q, want %q", c.in, got.String(), str)
		}
		if again, err := ParseRBDName(got.String()); err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("%q does not parse back: %+v, %v", got.String(), again, err)
		}
	}
	for _, bad := range []string{"rbd:", "rbd:pool", "rbd:/img", "rbd:pool/", "rbd:a/b/c/d", "rbd:a//c", "rbd:p/i@snap", "rbd:p/i:novalue", "/srv/x.img"} {
		if n, err := ParseRBDName(bad); err == nil {
			t.Errorf("ParseRBDName(%q) = %+v, want an error", bad, n)
		}
	}
}

func TestCephArgsUser(t *testing.T) {
	for in, want := range map[string]string{
		"":                                "",
		"--id vdisk":                      "vdisk",
		"--user=u --keyring /k":           "u",
		"--name client.x":                 "x",
		"-n client.y --conf /c":           "y",
		"--log-to-stderr=false --id":      "",
		"--id a --id b":                   "b",
		"--mon-host 10.0.0.1 --name=z":    "z",
		"--keyring /etc/ceph/k --id=vdk2": "vdk2",
	} {
		if got := cephArgsUser(in); got != want {
			t.Errorf("cephArgsUser(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSameStore(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "s.img")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"rbd:p/i", "rbd:p/i:id=x:conf=/c", true},
		{"rbd:p/i", "rbd:p/j", false},
		{"rbd:p/ns/i", "rbd:p/i", false},
		{f, filepath.Join(dir, ".", "s.img"), true},
		{f, "rbd:p/i", false},
		{f, filepath.Join(dir, "missing"), false},
	} {
		if got := SameStore(c.a, c.b); got != c.want {
			t.Errorf("SameStore(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// The names and their errors that need no cluster: BreakLock refuses a
// file, and a build without the rbd tag refuses every RBD name.
func TestRBDNamesWithoutCluster(t *testing.T) {
	if _, err := BreakLock(filepath.Join(t.TempDir(), "s.img")); !errors.Is(err, ErrUnsupported) {
		t.Errorf("BreakLock of a file: %v", err)
	}
	if err := Create("rbd:p/i", 1000); err == nil || !strings.Contains(err.Error(), "multiple of 4096") {
		t.Errorf("Create of an odd size: %v", err)
	}
	if RBDSupported {
		return
	}
	_, err := Open("rbd:rbd/store", OpenOptions{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "TAGS=rbd") {
		t.Errorf("Open of an RBD name without the rbd tag: %v", err)
	}
	if _, err := Stat("rbd:rbd/store"); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Stat: %v", err)
	}
}
