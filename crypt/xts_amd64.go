//go:build !purego

package crypt

import "golang.org/x/sys/cpu"

// dataKeys are the data key's AES-256 round keys for the AES-NI kernels,
// when the CPU has AES-NI: enc for encryption, dec the equivalent inverse
// cipher's for decryption (FIPS-197 5.3.5). With them the Cipher needs no
// crypto/aes block for the data key.
type dataKeys struct {
	enc, dec [roundKeyBytes]byte
	ok       bool // the CPU has AES-NI and the keys are set
}

// init expands key, the 32-byte data key, when the CPU has AES-NI, and
// reports whether it did.
func (k *dataKeys) init(key []byte) bool {
	if !cpu.X86.HasAES {
		return false
	}
	expandKey256(key, &k.enc)
	invertKeys(&k.enc, &k.dec)
	k.ok = true
	return true
}

// xorCrypt sets dst to the data key's AES of src XOR tw, XOR tw, for each
// 16-byte block of src with the tweak of the same index in tw, its low and
// high halves of IEEE 1619's little-endian 128-bit value, which on amd64
// are that value's bytes in memory. dst and src have the same length, 16
// bytes per tweak; they are the same slice or do not overlap.
func (c *Cipher) xorCrypt(dst, src []byte, tw [][2]uint64, encrypt bool) {
	if !c.keys.ok {
		c.xorCryptGeneric(dst, src, tw, encrypt)
		return
	}
	if len(src) == 0 {
		return
	}
	n := len(src) / aesBlock
	_, _ = dst[n*aesBlock-1], tw[n-1] // the kernel does not check
	if encrypt {
		xtsEncryptAsm(&c.keys.enc, &dst[0], &src[0], &tw[0], n)
	} else {
		xtsDecryptAsm(&c.keys.dec, &dst[0], &src[0], &tw[0], n)
	}
}

// xtsEncryptAsm and xtsDecryptAsm are xorCrypt for n blocks with round
// keys xk (xts_amd64.s). They need AES-NI.
//
//go:noescape
func xtsEncryptAsm(xk *[roundKeyBytes]byte, dst, src *byte, tw *[2]uint64, n int)

//go:noescape
func xtsDecryptAsm(xk *[roundKeyBytes]byte, dst, src *byte, tw *[2]uint64, n int)
