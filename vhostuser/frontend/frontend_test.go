package frontend

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

const (
	imageSize = 64 << 20
	wait      = 30 * time.Second // bound against hangs, not a time limit
)

// qsd is a qemu-storage-daemon exporting a raw image as vhost-user-blk.
type qsd struct {
	image, socket string
	cmd           *exec.Cmd
}

// startQSD starts qemu-storage-daemon on image with queues queues and
// waits for its socket; it is killed at cleanup.
func startQSD(t *testing.T, image, socket string, queues int) *qsd {
	t.Helper()
	bin, err := exec.LookPath("qemu-storage-daemon")
	if err != nil {
		testutil.Missing(t, "qemu-storage-daemon (Debian: qemu-system-common)")
	}
	os.Remove(socket)
	cmd := exec.Command(bin,
		"--blockdev", fmt.Sprintf("driver=file,node-name=f,filename=%s,cache.direct=on,aio=io_uring", image),
		"--export", fmt.Sprintf("type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path=%s,writable=on,num-queues=%d", socket, queues))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	q := &qsd{image: image, socket: socket, cmd: cmd}
	t.Cleanup(func() { q.kill(); os.Remove(socket) })
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(socket); err == nil {
			return q
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu-storage-daemon: no socket after %v: %s", wait, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (q *qsd) kill() {
	if q.cmd.Process != nil && q.cmd.ProcessState == nil {
		q.cmd.Process.Kill()
		q.cmd.Wait()
	}
}

func newImage(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, imageSize); err != nil {
		t.Fatal(err)
	}
	return path
}

func dialQSD(t *testing.T, queues int, opts Options) (*Device, *qsd) {
	t.Helper()
	dir := t.TempDir()
	q := startQSD(t, newImage(t), filepath.Join(dir, "blk.sock"), queues)
	opts.Socket = q.socket
	d, err := Dial(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, q
}

func do(t *testing.T, q *Queue, r Request) Completion {
	t.Helper()
	c, err := q.Do(r, wait)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != proto.BlkSOK {
		t.Fatalf("request type %d sector %d: status %d", r.Type, r.Sector, c.Status)
	}
	return c
}

func TestQSDNegotiation(t *testing.T) {
	d, _ := dialQSD(t, 2, Options{})
	cfg := d.Config()
	if cfg.Capacity != imageSize/proto.SectorSize {
		t.Errorf("capacity %d sectors, want %d", cfg.Capacity, imageSize/proto.SectorSize)
	}
	if cfg.BlkSize != 512 || cfg.NumQueues != 2 {
		t.Errorf("config %+v", cfg)
	}
	if len(d.Queues()) != 2 {
		t.Errorf("%d queues, want 2", len(d.Queues()))
	}
	for _, b := range []uint{proto.VirtioFVersion1, proto.VirtioFRingEventIdx, proto.VirtioFRingIndirectDesc, proto.BlkFFlush, proto.BlkFDiscard, proto.BlkFWriteZeroes, proto.BlkFMQ} {
		if !proto.Has(d.Features(), b) {
			t.Errorf("feature bit %d not negotiated (acked %#x)", b, d.Features())
		}
	}
	// qemu-storage-daemon 7.2 offers no INFLIGHT_SHMFD.
	for _, b := range []uint{proto.ProtocolConfig, proto.ProtocolMQ, proto.ProtocolReplyAck, proto.ProtocolBackendReq} {
		if !proto.Has(d.ProtocolFeatures(), b) {
			t.Errorf("protocol feature bit %d not negotiated (acked %#x)", b, d.ProtocolFeatures())
		}
	}
	t.Logf("features %#x protocol %#x config %+v", d.Features(), d.ProtocolFeatures(), cfg)
}

// TestQSDReadWrite writes random patterns through both queues (direct and
// indirect descriptors, one and several segments), reads them back,
// flushes, and checks that the image file holds the bytes; then
// write-zeroes, discard and get-id.
func TestQSDReadWrite(t *testing.T) {
	for _, indirect := range []bool{true, false} {
		t.Run(fmt.Sprintf("indirect=%v", indirect), func(t *testing.T) {
			d, srv := dialQSD(t, 2, Options{NoIndirect: !indirect})
			seed := testutil.Seed(t)
			rng := rand.New(rand.NewPCG(seed, 0))
			model := make([]byte, imageSize)
			tag := uint64(0)
			for i := 0; i < 64; i++ {
				q := d.Queues()[i%2]
				sectors := 1 + rng.IntN(256)
				sector := uint64(rng.IntN(imageSize/512 - sectors))
				segs := 1 + rng.IntN(4)
				var data []Buffer
				left := sectors * 512
				for s := 0; s < segs && left > 0; s++ {
					n := left
					if s < segs-1 {
						n = 512 * (1 + rng.IntN(left/512))
					}
					b, err := d.Alloc(n, 512)
					if err != nil {
						t.Fatal(err)
					}
					for j := range b.Bytes {
						b.Bytes[j] = byte(rng.Uint32())
					}
					data = append(data, b)
					left -= n
				}
				tag++
				do(t, q, Request{Type: proto.BlkTOut, Sector: sector, Data: data, Tag: tag})
				off := int(sector) * 512
				for _, b := range data {
					off += copy(model[off:], b.Bytes)
					d.Free(b)
				}
				// Read a range around it back through the other queue.
				rs := sector - min(sector, 8)
				rn := min(sectors+16, imageSize/512-int(rs))
				rb, err := d.Alloc(rn*512, 4096)
				if err != nil {
					t.Fatal(err)
				}
				tag++
				c := do(t, d.Queues()[(i+1)%2], Request{Type: proto.BlkTIn, Sector: rs, Data: []Buffer{rb}, Tag: tag})
				if int(c.Len) < rn*512 {
					t.Errorf("read of %d bytes: used len %d", rn*512, c.Len)
				}
				if !bytes.Equal(rb.Bytes, model[rs*512:int(rs)*512+rn*512]) {
					t.Fatalf("read back at sector %d differs from what was written", rs)
				}
				d.Free(rb)
			}
			tag++
			do(t, d.Queues()[0], Request{Type: proto.BlkTFlush, Tag: tag})
			file, err := os.ReadFile(srv.image)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(file, model) {
				t.Fatal("the image file does not hold what was written")
			}

			// Write-zeroes and discard of ranges with data.
			seg, err := d.Segments(proto.BlkSeg{Sector: 0, NumSectors: 2048})
			if err != nil {
				t.Fatal(err)
			}
			tag++
			do(t, d.Queues()[1], Request{Type: proto.BlkTWriteZeroes, Data: []Buffer{seg}, Tag: tag})
			clear(model[:2048*512])
			d.Free(seg)
			seg, err = d.Segments(proto.BlkSeg{Sector: 4096, NumSectors: 4096})
			if err != nil {
				t.Fatal(err)
			}
			tag++
			do(t, d.Queues()[0], Request{Type: proto.BlkTDiscard, Data: []Buffer{seg}, Tag: tag})
			d.Free(seg)
			rb, err := d.Alloc(2048*512, 4096)
			if err != nil {
				t.Fatal(err)
			}
			tag++
			do(t, d.Queues()[0], Request{Type: proto.BlkTIn, Sector: 0, Data: []Buffer{rb}, Tag: tag})
			if !bytes.Equal(rb.Bytes, model[:2048*512]) {
				t.Fatal("write-zeroes: the range does not read as zeros")
			}
			d.Free(rb)

			id, err := d.Alloc(proto.BlkIDBytes, 8)
			if err != nil {
				t.Fatal(err)
			}
			tag++
			do(t, d.Queues()[1], Request{Type: proto.BlkTGetID, Data: []Buffer{id}, Tag: tag})
			if id.Bytes[0] == 0 {
				t.Error("GET_ID wrote an empty ID")
			}
			t.Logf("device id %q", bytes.TrimRight(id.Bytes, "\x00"))
		})
	}
}

// load keeps depth writes of one block each in flight on q, each block
// holding its own sector number, until stop closes; it returns how many
// completed and the first failure. It holds pause's read lock while it
// uses q.
func load(d *Device, q *Queue, depth int, base uint64, pause *sync.RWMutex, stop <-chan struct{}) (int, error) {
	pause.RLock()
	defer pause.RUnlock()
	bufs := make([]Buffer, depth)
	for i := range bufs {
		b, err := d.Alloc(4096, 4096)
		if err != nil {
			return 0, err
		}
		bufs[i] = b
	}
	defer func() {
		for _, b := range bufs {
			d.Free(b)
		}
	}()
	var fail error
	done := 0
	next := uint64(0)
	submit := func(slot int) error {
		sector := base + (next%1024)*8
		next++
		for j := 0; j < 4096; j += 8 {
			copy(bufs[slot].Bytes[j:], fmt.Sprintf("%08x", sector)[:8])
		}
		return q.Submit(Request{Type: proto.BlkTOut, Sector: sector, Data: []Buffer{bufs[slot]}, Tag: uint64(slot)})
	}
	for i := 0; i < depth; i++ {
		if err := submit(i); err != nil {
			return 0, err
		}
	}
	stopping := false
	for q.InFlight() > 0 {
		if err := q.Kick(); err != nil {
			return done, err
		}
		select {
		case <-stop:
			stopping = true
		default:
		}
		if _, err := q.Poll(func(c Completion) {
			done++
			if c.Status != proto.BlkSOK && fail == nil {
				fail = fmt.Errorf("queue %d: write failed with status %d", q.Index(), c.Status)
			}
			if !stopping && fail == nil {
				if err := submit(int(c.Tag)); err != nil {
					fail = err
				}
			}
		}); err != nil {
			return done, err
		}
		if fail != nil {
			return done, fail
		}
		if _, err := q.Wait(100 * time.Millisecond); err != nil {
			return done, err
		}
		pause.RUnlock()
		pause.RLock()
	}
	return done, fail
}

// TestQSDReconnect kills qemu-storage-daemon with writes in flight on both
// queues, starts it again on the same socket and reconnects: every write
// completes without error (qemu-storage-daemon has no inflight region, so
// the frontend resubmits what was in flight) and the image holds every
// block's pattern.
func TestQSDReconnect(t *testing.T) {
	d, srv := dialQSD(t, 2, Options{ReconnectTimeout: wait})
	var pause sync.RWMutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]error, 2)
	counts := make([]int, 2)
	for i, q := range d.Queues() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], results[i] = load(d, q, 16, uint64(i)*1024*8, &pause, stop)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	srv.kill()
	select {
	case <-d.Dead():
	case <-time.After(wait):
		t.Fatal("the frontend did not notice the backend's death")
	}
	// Without an inflight region no queue owner may run during
	// Reconnect.
	pause.Lock()
	inFlight := d.Queues()[0].InFlight() + d.Queues()[1].InFlight()
	t.Logf("%d requests in flight when the daemon died", inFlight)
	if inFlight == 0 {
		t.Error("no request was in flight when the daemon died: the test proves nothing")
	}
	srv2 := startQSD(t, srv.image, srv.socket, 2)
	err := d.Reconnect()
	pause.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	for i, err := range results {
		if err != nil {
			t.Errorf("queue %d after %d writes: %v", i, counts[i], err)
		}
	}
	t.Logf("writes completed per queue: %v", counts)
	flush := uint64(1 << 40)
	do(t, d.Queues()[0], Request{Type: proto.BlkTFlush, Tag: flush})
	file, err := os.ReadFile(srv2.image)
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.Queues() {
		if counts[i] < 32 {
			t.Errorf("queue %d: only %d writes completed", i, counts[i])
		}
		for blk := 0; blk < min(counts[i], 1024); blk++ {
			sector := uint64(i)*1024*8 + uint64(blk)*8
			want := fmt.Sprintf("%08x", sector)
			if got := string(file[sector*512 : sector*512+8]); got != want {
				t.Fatalf("queue %d block at sector %d holds %q, want %q", i, sector, got, want)
			}
		}
	}
}

func TestAllocator(t *testing.T) {
	m, err := newMemory(1<<20, SmallPages)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	seed := testutil.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	var live []Buffer
	for i := 0; i < 2000; i++ {
		if len(live) > 0 && rng.IntN(2) == 0 {
			j := rng.IntN(len(live))
			m.release(live[j])
			live = append(live[:j], live[j+1:]...)
			continue
		}
		align := 1 << rng.IntN(13)
		b, err := m.alloc(1+rng.IntN(20000), align)
		if err != nil {
			continue // full
		}
		if b.Addr%uint64(align) != 0 {
			t.Fatalf("buffer at %d not aligned to %d", b.Addr, align)
		}
		for _, o := range live {
			if b.Addr < o.Addr+uint64(len(o.Bytes)) && o.Addr < b.Addr+uint64(len(b.Bytes)) {
				t.Fatalf("buffer [%d,+%d) overlaps [%d,+%d)", b.Addr, len(b.Bytes), o.Addr, len(o.Bytes))
			}
		}
		live = append(live, b)
	}
	for _, b := range live {
		m.release(b)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.mu.free) != 1 || m.mu.free[0] != (span{0, 1 << 20}) {
		t.Fatalf("after freeing everything the free list is %v", m.mu.free)
	}
}

// TestQSDSubmitChain reads through a hand-made chain (header, two data
// descriptors in reverse order in memory, status), as backend tests build
// bad ones.
func TestQSDSubmitChain(t *testing.T) {
	d, _ := dialQSD(t, 1, Options{NoIndirect: true})
	q := d.Queues()[0]
	w, err := d.Alloc(8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Bytes {
		w.Bytes[i] = byte(i / 512)
	}
	do(t, q, Request{Type: proto.BlkTOut, Sector: 16, Data: []Buffer{w}, Tag: 1})
	hdr, _ := d.Alloc(proto.BlkOutHdrSize, 16)
	status, _ := d.Alloc(1, 1)
	data, _ := d.Alloc(8192, 4096)
	proto.BlkOutHdr{Type: proto.BlkTIn, Sector: 16}.Put(hdr.Bytes)
	status.Bytes[0] = 0xff
	// The second half of the data first in the chain's order of memory.
	chain := []proto.Desc{
		{Addr: hdr.Addr, Len: proto.BlkOutHdrSize, Flags: proto.DescFNext, Next: 1},
		{Addr: data.Addr + 4096, Len: 4096, Flags: proto.DescFNext | proto.DescFWrite, Next: 2},
		{Addr: data.Addr, Len: 4096, Flags: proto.DescFNext | proto.DescFWrite, Next: 3},
		{Addr: status.Addr, Len: 1, Flags: proto.DescFWrite},
	}
	if err := q.SubmitChain(chain, 2); err != nil {
		t.Fatal(err)
	}
	if err := q.Kick(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for got := false; !got; {
		if _, err := q.Poll(func(c Completion) { got = c.Tag == 2 }); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion of the hand-made chain")
		}
		if !got {
			q.Wait(100 * time.Millisecond)
		}
	}
	if status.Bytes[0] != proto.BlkSOK {
		t.Fatalf("status %d", status.Bytes[0])
	}
	if !bytes.Equal(data.Bytes[4096:], w.Bytes[:4096]) || !bytes.Equal(data.Bytes[:4096], w.Bytes[4096:]) {
		t.Fatal("the chain's segments did not get the disk's bytes in chain order")
	}
	if q.InFlight() != 0 || len(q.free) != q.num {
		t.Fatalf("%d in flight, %d of %d descriptors free", q.InFlight(), len(q.free), q.num)
	}
}

// Two devices on one shared Memory: each backend reads the buffer the
// other was handed, at the same guest address, and closing a device
// leaves the memory to the other.
func TestQSDSharedMemory(t *testing.T) {
	mem, err := NewMemory(16<<20, SmallPages)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	d1, _ := dialQSD(t, 1, Options{Memory: mem})
	d2, _ := dialQSD(t, 1, Options{Memory: mem})
	b, err := d1.Alloc(4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 0))
	for i := range b.Bytes {
		b.Bytes[i] = byte(rng.Uint32())
	}
	want := bytes.Clone(b.Bytes)
	do(t, d1.Queues()[0], Request{Type: proto.BlkTOut, Sector: 8, Data: []Buffer{b}})
	do(t, d2.Queues()[0], Request{Type: proto.BlkTOut, Sector: 16, Data: []Buffer{b}})
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	clear(b.Bytes)
	do(t, d2.Queues()[0], Request{Type: proto.BlkTIn, Sector: 16, Data: []Buffer{b}})
	if !bytes.Equal(b.Bytes, want) {
		t.Fatal("the second device read back other bytes than the shared buffer held")
	}
	d2.Free(b)
}
