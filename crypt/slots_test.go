package crypt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
)

// fastArgon2 keeps passphrase tests quick; the format records whatever
// parameters a slot was made with.
var fastArgon2 = Argon2Params{Time: 1, MemoryKiB: 64, Threads: 1}

func newKeyFileSecret(t *testing.T, fill byte) *Secret {
	t.Helper()
	s, err := KeyFileSecret(bytes.Repeat([]byte{fill}, KeyFileSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newPassphrase(t *testing.T, p string) *Secret {
	t.Helper()
	s, err := PassphraseSecret([]byte(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newDataKey(t *testing.T) *DataKey {
	t.Helper()
	k, err := NewDataKey()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// tableWith returns a table for a new key with a key file slot (secret
// filled with 1) and a passphrase slot ("correct horse"), after a round
// trip through the encoding.
func tableWith(t *testing.T) (*SlotTable, *DataKey) {
	t.Helper()
	key := newDataKey(t)
	tab := NewSlotTable(key)
	if _, err := tab.AddSlot(key, newKeyFileSecret(t, 1), Argon2Params{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.AddSlot(key, newPassphrase(t, "correct horse"), fastArgon2); err != nil {
		t.Fatal(err)
	}
	return roundTrip(t, tab), key
}

func roundTrip(t *testing.T, tab *SlotTable) *SlotTable {
	t.Helper()
	b, err := tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != tab.EncodedSize() {
		t.Fatalf("encoded %d bytes, EncodedSize says %d", len(b), tab.EncodedSize())
	}
	got, err := DecodeSlotTable(b)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameKey(a, b *DataKey) bool { return bytes.Equal(a.bytes(), b.bytes()) }

func TestUnlockEachSlotKind(t *testing.T) {
	tab, key := tableWith(t)
	for _, tc := range []struct {
		secret *Secret
		slot   uint32
	}{{newKeyFileSecret(t, 1), 1}, {newPassphrase(t, "correct horse"), 2}} {
		got, id, err := tab.Unlock(tc.secret)
		if err != nil {
			t.Fatalf("%v: %v", tc.secret, err)
		}
		if id != tc.slot || !sameKey(got, key) {
			t.Errorf("%v: slot %d, same key %v; want slot %d and the table's key", tc.secret, id, sameKey(got, key), tc.slot)
		}
		got.Close()
	}
}

func TestWrongKeyIsWrongKey(t *testing.T) {
	tab, _ := tableWith(t)
	for _, s := range []*Secret{newKeyFileSecret(t, 2), newPassphrase(t, "correct horse "), newPassphrase(t, "Correct horse")} {
		if _, _, err := tab.Unlock(s); !errors.Is(err, ErrWrongKey) || errors.Is(err, ErrCorrupt) {
			t.Errorf("%v: %v, want ErrWrongKey", s, err)
		}
	}
	// A table without a slot of the secret's kind: wrong key as well.
	key := newDataKey(t)
	only := NewSlotTable(key)
	if _, err := only.AddSlot(key, newKeyFileSecret(t, 1), Argon2Params{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := only.Unlock(newPassphrase(t, "correct horse")); !errors.Is(err, ErrWrongKey) {
		t.Errorf("passphrase against key file slots: %v, want ErrWrongKey", err)
	}
}

func TestTwoDisksKeysDoNotCross(t *testing.T) {
	a, keyA := tableWith(t)
	keyB := newDataKey(t)
	b := NewSlotTable(keyB)
	if _, err := b.AddSlot(keyB, newKeyFileSecret(t, 9), Argon2Params{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Unlock(newKeyFileSecret(t, 1)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("disk A's key on disk B: %v, want ErrWrongKey", err)
	}
	if _, _, err := a.Unlock(newKeyFileSecret(t, 9)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("disk B's key on disk A: %v, want ErrWrongKey", err)
	}
	if _, err := a.AddSlot(keyB, newKeyFileSecret(t, 9), Argon2Params{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("adding a slot with another table's key: %v, want ErrInvalid", err)
	}
	if a.Matches(keyB) || !a.Matches(keyA) {
		t.Error("Matches does not tell the keys apart")
	}
	// A slot moved from B into A authenticates no more: its seal binds
	// A's check value.
	a.Slots = append(a.Slots, b.Slots[0])
	a.Slots[len(a.Slots)-1].ID = 77
	if _, _, err := a.Unlock(newKeyFileSecret(t, 9)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("slot moved from another table: %v, want ErrWrongKey", err)
	}
}

func TestAddRemoveSlots(t *testing.T) {
	tab, key := tableWith(t)
	id, err := tab.AddSlot(key, newKeyFileSecret(t, 3), Argon2Params{})
	if err != nil || id != 3 {
		t.Fatalf("AddSlot: id %d, %v; want id 3", id, err)
	}
	if err := tab.RemoveSlot(1); err != nil {
		t.Fatal(err)
	}
	if err := tab.RemoveSlot(1); !errors.Is(err, ErrNoSlot) {
		t.Errorf("removing a removed slot: %v, want ErrNoSlot", err)
	}
	tab = roundTrip(t, tab)
	if _, _, err := tab.Unlock(newKeyFileSecret(t, 1)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("removed slot's key: %v, want ErrWrongKey", err)
	}
	if k, id, err := tab.Unlock(newKeyFileSecret(t, 3)); err != nil || id != 3 || !sameKey(k, key) {
		t.Errorf("new slot: id %d, %v", id, err)
	}
	// A new slot's id never reuses a live one; ids after removal go on.
	if id, err := tab.AddSlot(key, newKeyFileSecret(t, 4), Argon2Params{}); err != nil || id != 4 {
		t.Errorf("AddSlot after removal: id %d, %v; want 4", id, err)
	}
	for _, id := range []uint32{2, 3} {
		if err := tab.RemoveSlot(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.RemoveSlot(4); !errors.Is(err, ErrLastSlot) {
		t.Errorf("removing the last slot: %v, want ErrLastSlot", err)
	}
	for len(tab.Slots) < MaxSlots {
		if _, err := tab.AddSlot(key, newKeyFileSecret(t, 5), Argon2Params{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tab.AddSlot(key, newKeyFileSecret(t, 5), Argon2Params{}); !errors.Is(err, ErrTooManySlots) {
		t.Errorf("slot %d: %v, want ErrTooManySlots", MaxSlots+1, err)
	}
	roundTrip(t, tab)
}

func TestAddSlotRefusesBadArgon2(t *testing.T) {
	key := newDataKey(t)
	tab := NewSlotTable(key)
	for _, p := range []Argon2Params{
		{},
		{Time: 1, MemoryKiB: 7, Threads: 1},
		{Time: 0, MemoryKiB: 64, Threads: 1},
		{Time: maxArgon2Time + 1, MemoryKiB: 64, Threads: 1},
		{Time: 1, MemoryKiB: maxArgon2MemoryKiB + 1, Threads: 1},
		{Time: 1, MemoryKiB: 64, Threads: 9},
	} {
		if _, err := tab.AddSlot(key, newPassphrase(t, "x"), p); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", p, err)
		}
	}
	if _, err := tab.MarshalBinary(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("encoding a table with no slot: %v, want ErrCorrupt", err)
	}
}

// reseal recomputes the checksums of an encoded table, as a deliberate
// tamperer would, so that only the seals can notice.
func reseal(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[32:], crc32.Checksum(b[0:32], castagnoli))
	for off := slotHeaderSize; off+slotSize <= len(b); off += slotSize {
		le.PutUint32(b[off+140:], crc32.Checksum(b[off:off+140], castagnoli))
	}
}

func TestDecodeFindsDamage(t *testing.T) {
	tab, _ := tableWith(t)
	good, err := tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	slot1 := slotHeaderSize + slotSize // the passphrase slot
	cases := []struct {
		name   string
		damage func(b []byte) []byte
		want   error
	}{
		{"short", func(b []byte) []byte { return b[:20] }, ErrCorrupt},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, ErrCorrupt},
		{"version", func(b []byte) []byte { b[8] = 2; return b }, ErrVersion},
		{"header checksum", func(b []byte) []byte { b[16] ^= 1; return b }, ErrCorrupt},
		{"slot checksum", func(b []byte) []byte { b[slot1+70] ^= 0x80; return b }, ErrCorrupt},
		{"truncated slot", func(b []byte) []byte { return b[:len(b)-1] }, ErrCorrupt},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }, ErrCorrupt},
		{"zero slots", func(b []byte) []byte { b[12] = 0; reseal(b); return b[:slotHeaderSize] }, ErrCorrupt},
		{"too many slots", func(b []byte) []byte { b[12] = MaxSlots + 1; reseal(b); return b }, ErrCorrupt},
		{"cipher", func(b []byte) []byte { b[10] = 9; reseal(b); return b }, ErrVersion},
		{"slot kind", func(b []byte) []byte { b[slot1+4] = 7; reseal(b); return b }, ErrVersion},
		{"duplicate id", func(b []byte) []byte { b[slot1] = 1; reseal(b); return b }, ErrCorrupt},
		{"zero id", func(b []byte) []byte { b[slot1] = 0; reseal(b); return b }, ErrCorrupt},
		{"reserved", func(b []byte) []byte { b[slot1+6] = 1; reseal(b); return b }, ErrCorrupt},
		{"argon2 memory huge", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[slot1+12:], maxArgon2MemoryKiB+1)
			reseal(b)
			return b
		}, ErrCorrupt},
		{"argon2 on a key file slot", func(b []byte) []byte { b[slotHeaderSize+8] = 1; reseal(b); return b }, ErrCorrupt},
	}
	for _, tc := range cases {
		b := tc.damage(bytes.Clone(good))
		if _, err := DecodeSlotTable(b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestTamperedSlotsDoNotOpen: changes that keep the encoding valid (the
// checksums recomputed) must not open with the right secret, nor yield a
// wrong key: the seal binds the parameters, salt, id and check value.
func TestTamperedSlotsDoNotOpen(t *testing.T) {
	tab, _ := tableWith(t)
	good, err := tab.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	slot0, slot1 := slotHeaderSize, slotHeaderSize+slotSize
	cases := []struct {
		name   string
		at     int
		secret *Secret
		want   error
	}{
		{"key file salt", slot0 + 16, newKeyFileSecret(t, 1), ErrWrongKey},
		{"key file nonce", slot0 + 48, newKeyFileSecret(t, 1), ErrWrongKey},
		{"key file sealed key", slot0 + 60, newKeyFileSecret(t, 1), ErrWrongKey},
		{"key file tag", slot0 + 139, newKeyFileSecret(t, 1), ErrWrongKey},
		{"key file slot id", slot0 + 1, newKeyFileSecret(t, 1), ErrWrongKey},
		{"passphrase time", slot1 + 8, newPassphrase(t, "correct horse"), ErrWrongKey},
		{"passphrase memory", slot1 + 13, newPassphrase(t, "correct horse"), ErrWrongKey},
		{"passphrase salt", slot1 + 47, newPassphrase(t, "correct horse"), ErrWrongKey},
		{"check value", 20, newKeyFileSecret(t, 1), ErrWrongKey},
	}
	for _, tc := range cases {
		b := bytes.Clone(good)
		b[tc.at] ^= 0x02
		reseal(b)
		tampered, err := DecodeSlotTable(b)
		if err != nil {
			t.Fatalf("%s: decode: %v", tc.name, err)
		}
		if k, _, err := tampered.Unlock(tc.secret); !errors.Is(err, tc.want) {
			t.Errorf("%s: key %v, %v; want %v", tc.name, k, err, tc.want)
		}
	}
}

func TestSecretsAreNotFormatted(t *testing.T) {
	s := newKeyFileSecret(t, 0x41) // "AAAA..."
	k := newDataKey(t)
	for _, v := range []any{s, k, *s, *k} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%q"} {
			out := fmt.Sprintf(verb, v)
			if bytes.Contains([]byte(out), []byte("AAAA")) || bytes.Contains([]byte(out), []byte("41414141")) ||
				(len(k.bytes()) > 0 && bytes.Contains([]byte(out), []byte(fmt.Sprintf("%x", k.bytes()[:8])))) {
				t.Errorf("%s of %T shows key material: %s", verb, v, out)
			}
		}
	}
	s.Close()
	s.Close() // closing twice is fine
	mustPanic(t, "a closed secret", func() { s.bytes() })
}

// TestSlotWithAnotherKeyIsCorrupt: a slot that authenticates under the
// table's check value but holds another key can only come from damage or
// a bug; Unlock says so instead of returning the wrong key.
func TestSlotWithAnotherKeyIsCorrupt(t *testing.T) {
	tab, _ := tableWith(t)
	other := newDataKey(t)
	secret := newKeyFileSecret(t, 6)
	slot := Slot{ID: 9, Kind: KindKeyFile}
	aead, err := slotAEAD(secret, &slot)
	if err != nil {
		t.Fatal(err)
	}
	aad := slotAAD(tab, &slot)
	aead.Seal(slot.Wrapped[:0], slot.Nonce[:], other.bytes(), aad[:])
	tab.Slots = append(tab.Slots, slot)
	tab = roundTrip(t, tab)
	if k, _, err := tab.Unlock(secret); !errors.Is(err, ErrCorrupt) {
		t.Errorf("key %v, %v; want ErrCorrupt", k, err)
	}
}
