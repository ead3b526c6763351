//go:build !purego

package crypt

import (
	"bytes"
	"crypto/aes"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"golang.org/x/sys/cpu"
)

// On a CPU with AES-NI, NewCipher must take the kernels' path, or the
// tests comparing it with x/crypto/xts would check only the generic one.
func TestNewCipherUsesAESNI(t *testing.T) {
	c, err := NewCipher(testDataKey(t, make([]byte, DataKeySize)), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if c.keys.ok != cpu.X86.HasAES {
		t.Fatalf("AES-NI kernels in use: %v, CPU has AES-NI: %v", c.keys.ok, cpu.X86.HasAES)
	}
	if c.keys.ok && c.k1 != nil {
		t.Error("a crypto/aes copy of the data key's schedule is kept as well")
	}
}

// The key schedules expandKey256 and invertKeys make, run through the
// kernels with all-zero tweaks (plain AES, block by block), agree with
// crypto/aes for 1 to 17 blocks: groups of eight and tails.
func TestKeyScheduleMatchesCryptoAES(t *testing.T) {
	if !cpu.X86.HasAES {
		t.Skip("no AES-NI: the kernels cannot run; the generic path is tested instead")
	}
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(seed, 0))
	for round := 0; round < 50; round++ {
		key := make([]byte, 32)
		for i := range key {
			key[i] = byte(r.Uint32())
		}
		if round == 0 {
			clear(key)
		}
		var k dataKeys
		if !k.init(key) {
			t.Fatal("dataKeys.init refused on a CPU with AES-NI")
		}
		ref, err := aes.NewCipher(key)
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + round%17
		src := make([]byte, n*aesBlock)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		zero := make([][2]uint64, n)
		want := make([]byte, len(src))
		for i := 0; i < len(src); i += aesBlock {
			ref.Encrypt(want[i:i+aesBlock], src[i:i+aesBlock])
		}
		got := make([]byte, len(src))
		xtsEncryptAsm(&k.enc, &got[0], &src[0], &zero[0], n)
		if !bytes.Equal(got, want) {
			t.Fatalf("key %x, %d blocks: encryption differs from crypto/aes:\n got %x\nwant %x", key, n, got, want)
		}
		xtsDecryptAsm(&k.dec, &got[0], &got[0], &zero[0], n)
		if !bytes.Equal(got, src) {
			t.Fatalf("key %x, %d blocks: decryption does not invert crypto/aes's encryption", key, n)
		}
	}
}
