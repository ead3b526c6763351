//go:build !purego

package crypt

import "math/bits"

// roundKeyBytes is the size of an AES-256 key schedule: 15 round keys.
const roundKeyBytes = 15 * aesBlock

// expandKey256 writes the AES-256 key schedule of key (32 bytes) into xk:
// FIPS-197 5.2 with Nk = 8, Nr = 14, the words w[i] as their bytes in
// order, which is the layout the AES-NI round instructions load. It works
// in xk itself so that no copy of the key is left elsewhere, and computes
// the S-box instead of looking it up, so that the expansion's memory
// accesses do not depend on the key.
func expandKey256(key []byte, xk *[roundKeyBytes]byte) {
	copy(xk[:32], key[:32])
	rcon := byte(1)
	for i := 8; i < roundKeyBytes/4; i++ {
		var t [4]byte
		copy(t[:], xk[4*(i-1):4*i])
		switch i % 8 {
		case 0: // RotWord, SubWord, Rcon
			t = [4]byte{sbox(t[1]) ^ rcon, sbox(t[2]), sbox(t[3]), sbox(t[0])}
			rcon = gfMul(rcon, 2)
		case 4: // SubWord
			t = [4]byte{sbox(t[0]), sbox(t[1]), sbox(t[2]), sbox(t[3])}
		}
		for j := range t {
			xk[4*i+j] = xk[4*(i-8)+j] ^ t[j]
		}
		clear(t[:])
	}
}

// invertKeys writes into dk the round keys of FIPS-197's equivalent
// inverse cipher (5.3.5), which AESDEC and AESDECLAST take: ek's round
// keys in reverse order, InvMixColumns applied to all but the first and
// the last.
func invertKeys(ek, dk *[roundKeyBytes]byte) {
	const last = roundKeyBytes/aesBlock - 1
	copy(dk[:aesBlock], ek[last*aesBlock:])
	copy(dk[last*aesBlock:], ek[:aesBlock])
	for r := 1; r < last; r++ {
		src := ek[(last-r)*aesBlock : (last-r+1)*aesBlock]
		dst := dk[r*aesBlock : (r+1)*aesBlock]
		for c := 0; c < aesBlock; c += 4 {
			a0, a1, a2, a3 := src[c], src[c+1], src[c+2], src[c+3]
			dst[c] = gfMul(a0, 14) ^ gfMul(a1, 11) ^ gfMul(a2, 13) ^ gfMul(a3, 9)
			dst[c+1] = gfMul(a0, 9) ^ gfMul(a1, 14) ^ gfMul(a2, 11) ^ gfMul(a3, 13)
			dst[c+2] = gfMul(a0, 13) ^ gfMul(a1, 9) ^ gfMul(a2, 14) ^ gfMul(a3, 11)
			dst[c+3] = gfMul(a0, 11) ^ gfMul(a1, 13) ^ gfMul(a2, 9) ^ gfMul(a3, 14)
		}
	}
}

// gfMul is a·b in AES's GF(2^8), modulo x^8 + x^4 + x^3 + x + 1, without
// branches on its operands.
func gfMul(a, b byte) byte {
	var p byte
	for range 8 {
		p ^= a & -(b & 1)
		a = a<<1 ^ 0x1b&-(a>>7)
		b >>= 1
	}
	return p
}

// sbox is AES's S-box (FIPS-197 5.1.1): the multiplicative inverse, a^254
// (0 for 0), then the affine transformation.
func sbox(a byte) byte {
	// a^254 = a^2 · a^4 · ... · a^128.
	inv := byte(1)
	sq := a
	for range 7 {
		sq = gfMul(sq, sq)
		inv = gfMul(inv, sq)
	}
	return inv ^ bits.RotateLeft8(inv, 1) ^ bits.RotateLeft8(inv, 2) ^ bits.RotateLeft8(inv, 3) ^ bits.RotateLeft8(inv, 4) ^ 0x63
}
