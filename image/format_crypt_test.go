package image

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/vdiskfs/vdiskfs/crypt"
)

// testSlotTable is an encoded key slot table with one key file slot.
func testSlotTable(t testing.TB) string {
	t.Helper()
	key, err := crypt.NewDataKey()
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	secret, err := crypt.KeyFileSecret(bytes.Repeat([]byte{3}, crypt.KeyFileSize))
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	tab := crypt.NewSlotTable(key)
	if _, err := tab.AddSlot(key, secret, crypt.Argon2Params{}); err != nil {
		t.Fatal(err)
	}
	b, err := tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCryptRecordsRoundTrip(t *testing.T) {
	slots := testSlotTable(t)
	recs := []record{
		{Type: recCrypt, ID: 4, Tweak: 1 << 40, Slots: slots},
		{Type: recMapTweak, ID: 4, Virt: 7, Phys: 100, Len: 3, Tweak: 1<<40 + 7},
		{Type: recMapTweak, ID: 4, Virt: 0, Phys: 9, Len: 1, Tweak: math.MaxUint64}, // the last tweak there is
		{Type: recMap, ID: 5, Virt: 0, Phys: 200, Len: 2},
	}
	var payload []byte
	for i := range recs {
		payload = appendRecord(payload, &recs[i])
	}
	got, err := decodeRecords(payload, uint32(len(recs)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("%d records, want %d", len(got), len(recs))
	}
	for i := range recs {
		if got[i] != recs[i] {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], recs[i])
		}
	}

	bad := map[string]record{
		"tweaks wrap":         {Type: recMapTweak, ID: 4, Virt: 0, Phys: 9, Len: 2, Tweak: math.MaxUint64},
		"tweak base too high": {Type: recCrypt, ID: 4, Tweak: maxTweakBase + 1, Slots: slots},
		"no slot table":       {Type: recCrypt, ID: 4},
		"damaged slot table":  {Type: recCrypt, ID: 4, Slots: slots[:len(slots)-1] + string([]byte{slots[len(slots)-1] ^ 0xff})},
	}
	for name, r := range bad {
		p := appendRecord(nil, &r)
		if _, err := decodeRecords(p, 1); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// An encrypted disk's extents carry their tweaks in a version-3
// checkpoint, a plain disk's stay 24 bytes, and the length is what
// ckptSize and ckptCryptSize say.
func TestCheckpointEncryptedDisk(t *testing.T) {
	var uuid [16]byte
	uuid[3] = 1
	slots := testSlotTable(t)
	c := &checkpoint{Version: cryptVersion, Seq: 9, UUID: uuid, NextID: 3, Disks: []ckptDisk{
		{ID: 1, Attr: diskAttr{Size: 1 << 20}, Name: "plain.raw", Extents: []extentRec{{Virt: 0, Phys: 10, Len: 5}}},
		{ID: 2, Attr: diskAttr{Size: 1 << 20}, Flags: diskFlagEncrypted | diskFlagClone, Origin: 1, Name: "secret.raw",
			TweakBase: 1 << 50, Slots: slots,
			Extents: []extentRec{{Virt: 0, Phys: 20, Len: 4, Tweak: 1 << 50}, {Virt: 4, Phys: 24, Len: 4, Tweak: 77}}},
	}, Free: []pext{{Start: 0, Len: 10}}}
	b := c.encode(nil)
	want := ckptSize(cryptVersion, 2, len("plain.raw")+len("secret.raw"), 3, 1, 0) + ckptCryptSize(1, len(slots), 2)
	if len(b) != want {
		t.Errorf("encoded %d bytes, the sizes say %d", len(b), want)
	}
	got, err := decodeCheckpoint(b, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if again := got.encode(nil); !bytes.Equal(again, b) {
		t.Fatal("checkpoint does not re-encode to the same bytes")
	}
	if e := got.Disks[1].Extents[1]; e.Tweak != 77 || got.Disks[1].TweakBase != 1<<50 || got.Disks[1].Slots != slots {
		t.Errorf("encrypted disk read back as %+v", got.Disks[1])
	}

	// The same disk in a version-2 checkpoint is damage, not a plain disk.
	c.Version = sharedVersion
	if _, err := decodeCheckpoint(c.encode(nil), uuid); !errors.Is(err, ErrCorrupt) {
		t.Errorf("encrypted disk in version 2: %v, want ErrCorrupt", err)
	}
	c.Version = cryptVersion
	c.Disks[1].Slots = slots[:40]
	if _, err := decodeCheckpoint(c.encode(nil), uuid); !errors.Is(err, ErrCorrupt) {
		t.Errorf("damaged slot table: %v, want ErrCorrupt", err)
	}
}

// Records of encrypted disks replayed into a store of an earlier version
// are damage: a store holding encrypted disks is version 3. And a version-3
// superblock without shared blocks is malformed.
func TestEncryptedRecordsNeedVersion3(t *testing.T) {
	ms := newMemStore(t, 4<<20, FormatOptions{})
	s := ms.s
	d := mustCreate(t, s, "a.raw", 1<<20)
	defer d.Close()
	for _, r := range []record{
		{Type: recMapTweak, ID: d.d.id, Virt: 0, Phys: 5, Len: 1, Tweak: 9},
		{Type: recCrypt, ID: d.d.id, Tweak: 1, Slots: testSlotTable(t)},
	} {
		s.mu.Lock()
		s.applyRecord(&r, 1)
		findings := s.openFindings
		s.openFindings = nil
		s.mu.Unlock()
		if len(findings) != 1 || findings[0].Code != CodeJournalRecord {
			t.Errorf("record type %d replayed into version %d: findings %+v", r.Type, s.sb.version(), findings)
		}
	}
	if blocks := d.d.m.Blocks(); blocks != 0 {
		t.Errorf("the refused map record mapped %d blocks", blocks)
	}

	img := make([]byte, pageSize)
	sb := s.sb
	sb.Features |= featEncrypted
	sb.encode(img)
	binary.LittleEndian.PutUint32(img[8:], cryptVersion)
	if got, err := decodeSuperblock(img); !errors.Is(err, ErrCorrupt) {
		t.Errorf("version-3 superblock without shared blocks: %+v, %v; want ErrCorrupt", got, err)
	}
	sb.Features |= featShared
	sb.encode(img)
	binary.LittleEndian.PutUint32(img[8:], cryptVersion)
	if _, err := decodeSuperblock(img); err != nil {
		t.Errorf("version-3 superblock: %v", err)
	}
}
