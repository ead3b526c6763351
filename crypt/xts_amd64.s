//go:build !purego

#include "textflag.h"

// The XTS kernels: for each of n 16-byte blocks, dst = AES(src XOR tw) XOR
// tw, with AES-256 round keys xk (15 of them, 16 bytes each, in the order
// the rounds use them) and the block's tweak tw. Eight blocks go through
// the rounds together so that the AES unit's latency is hidden; the rest,
// fewer than eight, one at a time. A group of eight is read whole before
// any of it is written, so dst may equal src.
//
// Registers: AX round keys, DI dst, SI src, DX tweaks, CX blocks left,
// X0-X7 the blocks, X8 the round key during the rounds, X8-X15 the tweaks
// before and after them.

// TWEAK8 XORs the eight blocks' tweaks into them.
#define TWEAK8 \
	MOVUPS 0(DX), X8; \
	MOVUPS 16(DX), X9; \
	MOVUPS 32(DX), X10; \
	MOVUPS 48(DX), X11; \
	MOVUPS 64(DX), X12; \
	MOVUPS 80(DX), X13; \
	MOVUPS 96(DX), X14; \
	MOVUPS 112(DX), X15; \
	PXOR X8, X0; \
	PXOR X9, X1; \
	PXOR X10, X2; \
	PXOR X11, X3; \
	PXOR X12, X4; \
	PXOR X13, X5; \
	PXOR X14, X6; \
	PXOR X15, X7

// LOAD8 loads eight blocks.
#define LOAD8 \
	MOVUPS 0(SI), X0; \
	MOVUPS 16(SI), X1; \
	MOVUPS 32(SI), X2; \
	MOVUPS 48(SI), X3; \
	MOVUPS 64(SI), X4; \
	MOVUPS 80(SI), X5; \
	MOVUPS 96(SI), X6; \
	MOVUPS 112(SI), X7

// STORE8 stores the eight blocks.
#define STORE8 \
	MOVUPS X0, 0(DI); \
	MOVUPS X1, 16(DI); \
	MOVUPS X2, 32(DI); \
	MOVUPS X3, 48(DI); \
	MOVUPS X4, 64(DI); \
	MOVUPS X5, 80(DI); \
	MOVUPS X6, 96(DI); \
	MOVUPS X7, 112(DI)

// ROUND8 applies round instruction op with the round key at off(AX) to
// the eight blocks.
#define ROUND8(op, off) \
	MOVUPS off(AX), X8; \
	op X8, X0; \
	op X8, X1; \
	op X8, X2; \
	op X8, X3; \
	op X8, X4; \
	op X8, X5; \
	op X8, X6; \
	op X8, X7

// ROUNDS8 is AES-256 on the eight blocks: the first key XORed in, 13
// rounds of op, the last of opLast.
#define ROUNDS8(op, opLast) \
	ROUND8(PXOR, 0); \
	ROUND8(op, 16); \
	ROUND8(op, 32); \
	ROUND8(op, 48); \
	ROUND8(op, 64); \
	ROUND8(op, 80); \
	ROUND8(op, 96); \
	ROUND8(op, 112); \
	ROUND8(op, 128); \
	ROUND8(op, 144); \
	ROUND8(op, 160); \
	ROUND8(op, 176); \
	ROUND8(op, 192); \
	ROUND8(op, 208); \
	ROUND8(opLast, 224)

// ROUND1 and ROUNDS1 are the same for the one block in X0.
#define ROUND1(op, off) \
	MOVUPS off(AX), X8; \
	op X8, X0

#define ROUNDS1(op, opLast) \
	ROUND1(PXOR, 0); \
	ROUND1(op, 16); \
	ROUND1(op, 32); \
	ROUND1(op, 48); \
	ROUND1(op, 64); \
	ROUND1(op, 80); \
	ROUND1(op, 96); \
	ROUND1(op, 112); \
	ROUND1(op, 128); \
	ROUND1(op, 144); \
	ROUND1(op, 160); \
	ROUND1(op, 176); \
	ROUND1(op, 192); \
	ROUND1(op, 208); \
	ROUND1(opLast, 224)

// XTS is the whole kernel with round instructions op and opLast.
#define XTS(op, opLast) \
	MOVQ xk+0(FP), AX; \
	MOVQ dst+8(FP), DI; \
	MOVQ src+16(FP), SI; \
	MOVQ tw+24(FP), DX; \
	MOVQ n+32(FP), CX; \
loop8: \
	CMPQ CX, $8; \
	JB   loop1; \
	LOAD8; \
	TWEAK8; \
	ROUNDS8(op, opLast); \
	TWEAK8; \
	STORE8; \
	ADDQ $128, SI; \
	ADDQ $128, DI; \
	ADDQ $128, DX; \
	SUBQ $8, CX; \
	JMP  loop8; \
loop1: \
	TESTQ CX, CX; \
	JZ    done; \
	MOVUPS 0(SI), X0; \
	MOVUPS 0(DX), X9; \
	PXOR X9, X0; \
	ROUNDS1(op, opLast); \
	PXOR X9, X0; \
	MOVUPS X0, 0(DI); \
	ADDQ $16, SI; \
	ADDQ $16, DI; \
	ADDQ $16, DX; \
	DECQ CX; \
	JMP  loop1; \
done: \
	RET

// func xtsEncryptAsm(xk *[roundKeyBytes]byte, dst, src *byte, tw *[2]uint64, n int)
TEXT ·xtsEncryptAsm(SB), NOSPLIT, $0-40
	XTS(AESENC, AESENCLAST)

// func xtsDecryptAsm(xk *[roundKeyBytes]byte, dst, src *byte, tw *[2]uint64, n int)
TEXT ·xtsDecryptAsm(SB), NOSPLIT, $0-40
	XTS(AESDEC, AESDECLAST)
