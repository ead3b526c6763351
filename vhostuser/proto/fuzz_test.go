package proto

import (
	"errors"
	"io"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// FuzzReadMessage feeds arbitrary bytes to ReadMessage and reads messages
// until the stream ends: it must return messages within the bounds or an
// error, never panic, and never more than MaxPayload of payload.
func FuzzReadMessage(f *testing.F) {
	p, _ := EncodeMemTable([]MemRegion{{Size: 4096}})
	f.Add(append(header(uint32(SetMemTable), Version, uint32(len(p))), p...))
	f.Add(append(header(uint32(GetFeatures), Version|FlagReply, 8), 1, 2, 3, 4, 5, 6, 7, 8))
	f.Add(header(1, 0, 0))
	f.Add(header(1, Version, 0xffffffff))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := testutil.SocketPair(t)
		go func() {
			a.Write(data)
			a.CloseWrite()
		}()
		for {
			m, err := ReadMessage(b)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrMalformed) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(m.Payload) > MaxPayload || len(m.FDs) != 0 || m.Flags&FlagVersionMask != Version {
				t.Fatalf("message out of bounds: %v", m)
			}
			decodeAny(m)
		}
	})
}

// decodeAny runs the decoder the message's code names.
func decodeAny(m Message) {
	switch Request(m.Request) {
	case SetMemTable:
		DecodeMemTable(m.Payload)
	case SetVringAddr:
		DecodeVringAddr(m.Payload)
	case SetVringNum, SetVringBase, GetVringBase, SetVringEnable:
		DecodeVringState(m.Payload)
	case GetConfig, SetConfig:
		DecodeConfig(m.Payload)
	case GetInflightFD, SetInflightFD:
		DecodeInflight(m.Payload)
	case AddMemReg, RemMemReg:
		DecodeMemRegMsg(m.Payload)
	case SetLogBase:
		DecodeLog(m.Payload)
	default:
		DecodeU64(m.Payload)
	}
}

// FuzzDecodePayloads runs every payload decoder on arbitrary bytes.
func FuzzDecodePayloads(f *testing.F) {
	p, _ := EncodeMemTable([]MemRegion{{Size: 4096}, {GuestAddr: 1}})
	f.Add(p)
	c, _ := Config{Data: make([]byte, 60)}.Encode()
	f.Add(c)
	f.Fuzz(func(t *testing.T, data []byte) {
		for r := Request(0); r <= GetStatus; r++ {
			decodeAny(Message{Request: uint32(r), Payload: data})
		}
		if regions, err := DecodeMemTable(data); err == nil && (len(regions) == 0 || len(regions) > MaxMemRegions) {
			t.Fatalf("memory table of %d regions accepted", len(regions))
		}
		if cfg, err := DecodeConfig(data); err == nil && len(cfg.Data) > MaxConfigSize {
			t.Fatalf("config of %d bytes accepted", len(cfg.Data))
		}
		DecodeBlkConfig(data)
		DecodeBlkOutHdr(data)
		DecodeBlkSeg(data)
		DecodeDesc(data)
		DecodeVringArea(data)
	})
}
