package transfer

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
)

func rawKey(t *testing.T, fill byte) *crypt.Secret {
	t.Helper()
	k, err := crypt.KeyFileSecret(bytes.Repeat([]byte{fill}, crypt.KeyFileSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// A raw stream of an encrypted disk, complete and incremental, holds no
// plaintext, is received by a store that never has the key (locked, and
// fsck clean), and the received disks read as the sent ones once
// unlocked with the sender's key; a plain stream of the same disk is
// plaintext, and a raw one of a plain disk is refused.
func TestRawStreams(t *testing.T) {
	src, dst := newStore(t, 64<<20), newStore(t, 64<<20)
	const size = 3<<20 + 123
	if _, err := src.CreateEncrypted("a", size, image.Attr{Mode: 0o600}, rawKey(t, 1), crypt.Argon2Params{}); err != nil {
		t.Fatal(err)
	}
	first := randomBytes(1, size)
	writeAt(t, src, "a", first, 0)
	if _, err := src.Snapshot("a", "s1"); err != nil {
		t.Fatal(err)
	}
	writeAt(t, src, "a", randomBytes(2, 70000), 12345)
	h, err := src.OpenDisk("a")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Punch(1<<20+100, 300000); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := src.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	want1, want2 := readDisk(t, src, "s1"), readDisk(t, src, "s2")

	var full, incr bytes.Buffer
	if _, err := Send(&full, src, "s1", SendOptions{Raw: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := Send(&incr, src, "s2", SendOptions{Raw: true, From: "s1"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+64 <= len(want2); i += 65536 {
		if bytes.Contains(full.Bytes(), want1[i:i+64]) || bytes.Contains(incr.Bytes(), want2[i:i+64]) {
			t.Fatalf("a raw stream holds plaintext at %d", i)
		}
	}
	if incr.Len() > 1<<20 {
		t.Errorf("the incremental raw stream is %d bytes: more than the changes", incr.Len())
	}
	if _, err := Receive(&full, dst, "r1", ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Receive(&incr, dst, "r2", ReceiveOptions{}); err != nil {
		t.Fatal(err)
	}
	if info, _ := dst.Stat("r2"); !info.Encrypted || !info.Locked || !info.Snapshot {
		t.Errorf("received %+v", info)
	}
	if rep := dst.Check(); !rep.Clean() {
		t.Fatalf("check without the key: %v", rep.Findings)
	}
	if _, err := dst.Unlock("r1", rawKey(t, 2)); !errors.Is(err, image.ErrWrongKey) {
		t.Errorf("unlock with another key: %v", err)
	}
	if n, err := dst.Unlock("r1", rawKey(t, 1)); err != nil || n != 2 {
		t.Fatalf("unlock: %d disks, %v", n, err)
	}
	if !bytes.Equal(readDisk(t, dst, "r1"), want1) || !bytes.Equal(readDisk(t, dst, "r2"), want2) {
		t.Fatal("received raw disks do not read as sent")
	}

	var plain bytes.Buffer
	if _, err := Send(&plain, src, "s1", SendOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(plain.Bytes(), want1[65536:65600]) {
		t.Error("a plain stream of an unlocked encrypted disk is not plaintext")
	}
	if _, err := src.Create("p", 4096, image.Attr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Send(&bytes.Buffer{}, src, "p", SendOptions{Raw: true}); !errors.Is(err, ErrRaw) {
		t.Errorf("raw send of a plain disk: %v", err)
	}
}
