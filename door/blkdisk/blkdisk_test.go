package blkdisk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// wait bounds every wait for a reply or completion against hangs.
const wait = 30 * time.Second

const diskSize = 64 << 20

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// testCase is a store with one disk served on a socket.
type testCase struct {
	t      testing.TB
	store  *image.Store
	disk   *image.Disk
	socket string
	srv    *blk.Server
}

// newMemCase serves a disk of a store on a memory backend (the blocking
// and Do paths: no ring).
func newMemCase(t testing.TB) *testCase {
	s, _ := newMemStore(t)
	return newCase(t, s)
}

// newMemStore is a store on a memory backend, and the backend.
func newMemStore(t testing.TB) (*image.Store, *backend.Mem) {
	be := backend.NewMem(256 << 20)
	be.CheckAlignment(512)
	if err := image.Format(be, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(be, image.Options{CommitInterval: -1, Strict: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return s, be
}

// newFileCase serves a disk of a store on a file in dir (the io_uring
// path, O_DIRECT).
func newFileCase(t testing.TB, dir string) *testCase { return newCase(t, newFileStore(t, dir)) }

// newFileStore is a store on a file in dir.
func newFileStore(t testing.TB, dir string) *image.Store {
	path := filepath.Join(dir, "store.img")
	if err := image.FormatPath(path, 1<<30, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.OpenPath(path, image.Options{CommitInterval: -1, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCase(t testing.TB, s *image.Store) *testCase { return newCaseWith(t, s, nil) }

// newCaseWith is newCase, with an encrypted disk when key is not nil.
func newCaseWith(t testing.TB, s *image.Store, key *crypt.Secret) *testCase {
	var err error
	if key != nil {
		_, err = s.CreateEncrypted("vm0", diskSize, image.Attr{Mode: 0o600}, key, crypt.Argon2Params{})
	} else {
		_, err = s.Create("vm0", diskSize, image.Attr{Mode: 0o600})
	}
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("vm0")
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCase{t: t, store: s, disk: d, socket: filepath.Join(t.TempDir(), "vm0.sock")}
	tc.serve()
	t.Cleanup(func() {
		if tc.srv != nil {
			if err := tc.srv.Close(); err != nil {
				t.Error(err)
			}
		}
		d.Close()
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check: %v", rep.Findings)
		}
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return tc
}

func (tc *testCase) serve() {
	srv, err := blk.Serve(New(tc.store, tc.disk), blk.Config{Socket: tc.socket, ID: "vm0", Queues: 2, SocketGroup: -1, Log: quiet()})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.srv = srv
}

func (tc *testCase) dial(o frontend.Options) *frontend.Device {
	o.Socket = tc.socket
	if o.ReplyTimeout == 0 {
		o.ReplyTimeout, o.ReconnectTimeout = wait, wait
	}
	d, err := frontend.Dial(o)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { d.Close() })
	return d
}

func do(t testing.TB, q *frontend.Queue, r frontend.Request) frontend.Completion {
	t.Helper()
	c, err := q.Do(r, wait)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustOK(t testing.TB, q *frontend.Queue, r frontend.Request) frontend.Completion {
	t.Helper()
	c := do(t, q, r)
	if c.Status != proto.BlkSOK {
		t.Fatalf("request type %d at sector %d: status %d", r.Type, r.Sector, c.Status)
	}
	return c
}

func alloc(t testing.TB, d *frontend.Device, n, align int) frontend.Buffer {
	t.Helper()
	b, err := d.Alloc(n, align)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// collectOK polls q until n requests completed (or the wait bound passed),
// each with status OK, and returns how many did.
func collectOK(t testing.TB, q *frontend.Queue, n int) int {
	t.Helper()
	done := 0
	for deadline := time.Now().Add(wait); done < n && time.Now().Before(deadline); {
		if _, err := q.Poll(func(c frontend.Completion) {
			if c.Status != proto.BlkSOK {
				t.Errorf("request %d: status %d", c.Tag, c.Status)
			}
			done++
		}); err != nil {
			t.Fatal(err)
		}
		if done < n {
			q.Wait(100 * time.Millisecond)
		}
	}
	return done
}

// split cuts b into pieces of at most seg bytes.
func split(b frontend.Buffer, seg int) []frontend.Buffer {
	var out []frontend.Buffer
	for off := 0; off < b.Len(); off += seg {
		out = append(out, b.Slice(off, min(seg, b.Len()-off)))
	}
	return out
}

func TestNegotiation(t *testing.T) {
	tc := newMemCase(t)
	d := tc.dial(frontend.Options{})
	cfg := d.Config()
	if cfg.Capacity != diskSize/512 || cfg.BlkSize != 512 || cfg.NumQueues != 2 || cfg.PhysicalBlockExp != 3 || cfg.SegMax == 0 {
		t.Errorf("config %+v", cfg)
	}
	if len(d.Queues()) != 2 {
		t.Errorf("%d queues", len(d.Queues()))
	}
	for _, b := range []uint{proto.VirtioFVersion1, proto.VirtioFRingEventIdx, proto.VirtioFRingIndirectDesc,
		proto.BlkFFlush, proto.BlkFDiscard, proto.BlkFWriteZeroes, proto.BlkFMQ, proto.BlkFTopology} {
		if !proto.Has(d.Features(), b) {
			t.Errorf("feature %d not negotiated (%#x)", b, d.Features())
		}
	}
	for _, b := range []uint{proto.ProtocolConfig, proto.ProtocolMQ, proto.ProtocolReplyAck, proto.ProtocolBackendReq, proto.ProtocolInflightShmFD} {
		if !proto.Has(d.ProtocolFeatures(), b) {
			t.Errorf("protocol feature %d not negotiated (%#x)", b, d.ProtocolFeatures())
		}
	}
}

// TestReadWrite writes random data of many shapes through both queues,
// reads it back through the socket and from the disk, then flushes.
func TestReadWrite(t *testing.T) {
	for _, c := range []struct {
		name string
		mk   func(testing.TB) *testCase
		o    frontend.Options
	}{
		{"mem", newMemCase, frontend.Options{}},
		{"file", func(t testing.TB) *testCase { return newFileCase(t, varTmp(t)) }, frontend.Options{}},
		{"file/direct", func(t testing.TB) *testCase { return newFileCase(t, varTmp(t)) }, frontend.Options{NoIndirect: true, NoEventIdx: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := c.mk(t)
			d := tc.dial(c.o)
			seed := testutil.Seed(t)
			rng := rand.New(rand.NewPCG(seed, 1))
			shapes := []struct{ n, seg int }{
				{4096, 4096}, {1 << 20, 4096}, {1 << 20, 1 << 20}, {512, 512}, {1536, 512}, {64 << 10, 8192}, {12288, 4096},
			}
			for i, sh := range shapes {
				q := d.Queues()[i%2]
				buf := alloc(t, d, sh.n, 4096)
				for j := range buf.Bytes {
					buf.Bytes[j] = byte(rng.Uint32())
				}
				want := append([]byte(nil), buf.Bytes...)
				sector := uint64(rng.IntN(diskSize/512 - sh.n/512 + 1))
				if sh.n%4096 == 0 && i%3 == 0 {
					sector &^= 7
				}
				segs := split(buf, sh.seg)
				if len(segs) > q.MaxSegments() {
					segs = split(buf, ((sh.n+q.MaxSegments()-1)/q.MaxSegments()+4095)&^4095)
				}
				mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: sector, Data: segs, Tag: uint64(i)})
				if !tc.store.MappingsDurable() {
					t.Fatalf("shape %+v: a write was returned before its mapping was committed", sh)
				}
				clear(buf.Bytes)
				c := mustOK(t, d.Queues()[(i+1)%2], frontend.Request{Type: proto.BlkTIn, Sector: sector, Data: segs, Tag: uint64(i)})
				if !bytes.Equal(buf.Bytes, want) || c.Len != uint32(sh.n+1) {
					t.Fatalf("shape %+v at sector %d: read back differs (used len %d)", sh, sector, c.Len)
				}
				got := make([]byte, sh.n)
				if _, err := tc.disk.ReadAt(got, int64(sector*512)); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("shape %+v at sector %d: the disk holds other bytes (%v)", sh, sector, err)
				}
				d.Free(buf)
			}
			mustOK(t, d.Queues()[0], frontend.Request{Type: proto.BlkTFlush, Tag: 99})
			st := tc.srv.Stats()
			if st.Write.Requests != uint64(len(shapes)) || st.Read.Requests != uint64(len(shapes)) || st.Flush.Requests != 1 || st.Inflight != 0 {
				t.Errorf("stats %+v", st)
			}
			t.Logf("fallbacks %d of %d requests", st.Fallbacks, 2*len(shapes))
		})
	}
}

// TestScatteredRequests: a read or write whose data lies in guest pages
// that are not next to each other (as a guest's buffer is) reaches the
// store as one request, and reads back the same bytes into buffers
// scattered otherwise. On a plain disk, a request whose range and pieces
// are block-aligned and whose pieces are large (buffers on huge pages)
// goes to the backing straight from and into its pieces (vectored); the
// others, and every one on an encrypted disk, are staged
// through one buffer, on the owner's planned path and on the blocking
// path (pieces of 512 bytes, unaligned to the store's block). A read of
// holes is staged, and reads zeros.
func TestScatteredRequests(t *testing.T) {
	for _, encrypted := range []bool{false, true} {
		var key *crypt.Secret
		if encrypted {
			var err error
			if key, err = crypt.KeyFileSecret(bytes.Repeat([]byte{7}, crypt.KeyFileSize)); err != nil {
				t.Fatal(err)
			}
			defer key.Close()
		}
		tc := newCaseWith(t, newFileStore(t, varTmp(t)), key)
		scatteredRequests(t, tc, tc.dial(frontend.Options{MaxSegments: 254}), encrypted) // as QEMU's vda: seg_max
	}
}

// TestHugePageGuestMemory: guest memory on hugetlb pages, as a VM with
// huge-page memory has it, is served as any other: the scattered shapes
// of TestScatteredRequests (vectored where their pieces are large), and a
// 1 MiB request in one piece, planned straight into guest memory.
func TestHugePageGuestMemory(t *testing.T) {
	const size = 64 << 20
	testutil.HugePages(t, size/frontend.HugePageSize)
	mem, err := frontend.NewMemory(size, frontend.HugePages)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() }) // after the devices close (cleanups run last first)
	tc := newFileCase(t, varTmp(t))
	d := tc.dial(frontend.Options{MaxSegments: 254, Memory: mem})
	scatteredRequests(t, tc, d, false)

	buf := alloc(t, d, 1<<20, frontend.HugePageSize)
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 3))
	for i := range buf.Bytes {
		buf.Bytes[i] = byte(rng.Uint32())
	}
	want := bytes.Clone(buf.Bytes)
	before := tc.srv.Stats()
	mustOK(t, d.Queues()[0], frontend.Request{Type: proto.BlkTOut, Sector: 4096, Data: []frontend.Buffer{buf}})
	clear(buf.Bytes)
	mustOK(t, d.Queues()[1], frontend.Request{Type: proto.BlkTIn, Sector: 4096, Data: []frontend.Buffer{buf}})
	got := make([]byte, len(want))
	if _, err := tc.disk.ReadAt(got, 4096*512); err != nil || !bytes.Equal(got, want) || !bytes.Equal(buf.Bytes, want) {
		t.Fatalf("1 MiB in one huge page: read back or the disk differs (%v)", err)
	}
	if st := tc.srv.Stats(); st.Fallbacks != before.Fallbacks || st.Staged != before.Staged {
		t.Errorf("1 MiB in one huge page: %d fallbacks, %d staged, want none", st.Fallbacks-before.Fallbacks, st.Staged-before.Staged)
	}
}

func scatteredRequests(t *testing.T, tc *testCase, d *frontend.Device, encrypted bool) {
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 2))
	// scattered returns n bytes as pieces of seg bytes, each in a buffer
	// of its own with a page between them, and the buffers to free.
	scattered := func(n, seg int) (segs, bufs []frontend.Buffer) {
		for off := 0; off < n; off += seg {
			b := alloc(t, d, seg, 4096)
			gap := alloc(t, d, 4096, 4096)
			bufs = append(bufs, b, gap)
			segs = append(segs, b)
		}
		return segs, bufs
	}
	joined := func(segs []frontend.Buffer) (b []byte) {
		for _, s := range segs {
			b = append(b, s.Bytes...)
		}
		return b
	}
	free := func(bufs []frontend.Buffer) {
		for _, b := range bufs {
			d.Free(b)
		}
	}
	requests := func(name string) uint64 {
		return tc.store.Metrics().Histograms[name].Count
	}
	// copied checks how many requests since before were staged and how
	// many vectored, of which want went straight to the backing.
	copied := func(what string, before blk.Stats, n, want int) {
		t.Helper()
		st := tc.srv.Stats()
		if v, s := st.Vectored-before.Vectored, st.Staged-before.Staged; v != uint64(want) || s != uint64(n-want) {
			t.Errorf("encrypted %v, %s: %d vectored and %d staged, want %d and %d", encrypted, what, v, s, want, n-want)
		}
	}
	vectored := func(sector, seg int) bool {
		return !encrypted && sector*512%4096 == 0 && seg%4096 == 0 && seg >= 64<<10
	}
	for i, sh := range []struct{ n, seg, sector int }{
		{1 << 20, 8192, 2048}, {254 * 4096, 4096, 8}, {12 << 10, 512, 3}, {8192, 4096, 100}, {64 << 10, 4096, 1 << 16},
		{2 << 20, 256 << 10, 1 << 14}, {1 << 20, 128 << 10, 1<<16 + 1024},
	} {
		q := d.Queues()[i%2]
		want := make([]byte, sh.n)
		for j := range want {
			want[j] = byte(rng.Uint32())
		}
		segs, bufs := scattered(sh.n, sh.seg)
		n := 0
		for _, b := range segs {
			n += copy(b.Bytes, want[n:])
		}
		before, stBefore := requests("write_request_size_bytes"), tc.srv.Stats()
		mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: uint64(sh.sector), Data: segs, Tag: uint64(i)})
		if got := requests("write_request_size_bytes") - before; got != 1 {
			t.Errorf("shape %+v: the store saw %d write requests for one scattered write, want 1", sh, got)
		}
		got := make([]byte, sh.n)
		if _, err := tc.disk.ReadAt(got, int64(sh.sector*512)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("encrypted %v, shape %+v: the disk holds other bytes (%v)", encrypted, sh, err)
		}
		free(bufs)
		direct := 0
		if vectored(sh.sector, sh.seg) {
			direct++
		}
		// Read back into pieces of another size.
		back := sh.seg / 2
		if back < 512 || sh.n/back > 254 {
			back = sh.seg * 2
		}
		if vectored(sh.sector, back) {
			direct++
		}
		segs, bufs = scattered(sh.n, back)
		before = requests("read_request_size_bytes")
		c := mustOK(t, d.Queues()[(i+1)%2], frontend.Request{Type: proto.BlkTIn, Sector: uint64(sh.sector), Data: segs, Tag: uint64(i)})
		if got := requests("read_request_size_bytes") - before; got != 1 {
			t.Errorf("shape %+v: the store saw %d read requests for one scattered read, want 1", sh, got)
		}
		if !bytes.Equal(joined(segs), want) || c.Len != uint32(sh.n+1) {
			t.Fatalf("encrypted %v, shape %+v: read back differs (used len %d)", encrypted, sh, c.Len)
		}
		free(bufs)
		copied(fmt.Sprintf("shape %+v", sh), stBefore, 2, direct)
	}
	// Holes, and holes beside data (the 64 KiB at sector 1<<16): in
	// pieces that would be vectored, but staged, so that holes read zeros.
	for _, r := range []struct{ sector, n int }{{100000, 256 << 10}, {1<<16 - 128, 128 << 10}} {
		segs, bufs := scattered(r.n, 64<<10)
		for _, b := range segs {
			for j := range b.Bytes {
				b.Bytes[j] = 0xee
			}
		}
		stBefore := tc.srv.Stats()
		mustOK(t, d.Queues()[0], frontend.Request{Type: proto.BlkTIn, Sector: uint64(r.sector), Data: segs})
		want := make([]byte, r.n)
		if _, err := tc.disk.ReadAt(want, int64(r.sector*512)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(joined(segs), want) {
			t.Fatalf("encrypted %v, read of holes at sector %d: got other bytes than the disk holds", encrypted, r.sector)
		}
		copied(fmt.Sprintf("read of holes at sector %d", r.sector), stBefore, 1, 0)
		free(bufs)
	}
}

// varTmp is a directory on /var/tmp (O_DIRECT works there; /tmp may be
// tmpfs), removed at cleanup.
func varTmp(t testing.TB) string {
	dir, err := os.MkdirTemp("/var/tmp", "blkdisk-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestZeroes covers DISCARD, WRITE_ZEROES (with and without unmap),
// GET_ID, an unsupported type and out-of-range requests.
func TestZeroes(t *testing.T) {
	tc := newMemCase(t)
	d := tc.dial(frontend.Options{})
	q := d.Queues()[0]
	buf := alloc(t, d, 64<<10, 4096)
	for i := range buf.Bytes {
		buf.Bytes[i] = 0xa5
	}
	mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 0, Data: []frontend.Buffer{buf}, Tag: 1})
	zero := make([]byte, 64<<10)
	for i, c := range []struct {
		typ   uint32
		seg   proto.BlkSeg
		state uint8
	}{
		{proto.BlkTDiscard, proto.BlkSeg{Sector: 8, NumSectors: 8}, proto.BlkSOK},
		{proto.BlkTWriteZeroes, proto.BlkSeg{Sector: 16, NumSectors: 16, Flags: proto.BlkSegFlagUnmap}, proto.BlkSOK},
		{proto.BlkTWriteZeroes, proto.BlkSeg{Sector: 33, NumSectors: 3}, proto.BlkSOK},
		{proto.BlkTDiscard, proto.BlkSeg{Sector: 8, NumSectors: 8, Flags: proto.BlkSegFlagUnmap}, proto.BlkSUnsupp},
		{proto.BlkTDiscard, proto.BlkSeg{Sector: diskSize / 512, NumSectors: 1}, proto.BlkSIOErr},
	} {
		segs, err := d.Segments(c.seg)
		if err != nil {
			t.Fatal(err)
		}
		if got := do(t, q, frontend.Request{Type: c.typ, Data: []frontend.Buffer{segs}, Tag: uint64(10 + i)}); got.Status != c.state {
			t.Errorf("%d %+v: status %d, want %d", c.typ, c.seg, got.Status, c.state)
		}
		d.Free(segs)
	}
	got := make([]byte, 64<<10)
	if _, err := tc.disk.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int{{8, 16}, {16, 32}, {33, 36}} {
		if !bytes.Equal(got[r[0]*512:r[1]*512], zero[:(r[1]-r[0])*512]) {
			t.Errorf("sectors %d-%d not zero", r[0], r[1])
		}
	}
	if got[8*512-1] != 0xa5 || got[32*512] != 0xa5 || got[36*512] != 0xa5 {
		t.Error("zeroing spilled past its range")
	}
	id := alloc(t, d, 20, 8)
	if c := mustOK(t, q, frontend.Request{Type: proto.BlkTGetID, Data: []frontend.Buffer{id}, Tag: 20}); string(id.Bytes[:3]) != "vm0" || id.Bytes[3] != 0 || c.Len != 21 {
		t.Errorf("GET_ID %q, used len %d", id.Bytes, c.Len)
	}
	if c := do(t, q, frontend.Request{Type: 77, Data: []frontend.Buffer{id}, Tag: 21}); c.Status != proto.BlkSUnsupp {
		t.Errorf("type 77: status %d", c.Status)
	}
	if c := do(t, q, frontend.Request{Type: proto.BlkTIn, Sector: diskSize/512 - 1, Data: []frontend.Buffer{buf.Slice(0, 1024)}, Tag: 22}); c.Status != proto.BlkSIOErr {
		t.Errorf("read past the end: status %d", c.Status)
	}
	if c := do(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 0, Data: []frontend.Buffer{buf.Slice(0, 100)}, Tag: 23}); c.Status != proto.BlkSIOErr {
		t.Errorf("write of 100 bytes: status %d", c.Status)
	}
	if !tc.store.MappingsDurable() {
		t.Error("discards and write-zeroes were returned before their mappings were committed")
	}
	st := tc.srv.Stats()
	if st.Discard.Requests != 3 || st.WriteZeroes.Requests != 2 || st.GetID.Requests != 1 || st.Unsupported != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestReconnect: the server goes away with the frontend's requests in
// its ring and a new one on the same socket serves them; a second
// frontend is refused while one is connected; a resize reaches the
// frontend as a config change.
func TestReconnect(t *testing.T) {
	tc := newMemCase(t)
	d := tc.dial(frontend.Options{})
	if _, err := frontend.Dial(frontend.Options{Socket: tc.socket, ReplyTimeout: time.Second}); err == nil {
		t.Error("a second frontend was served")
	}
	q := d.Queues()[0]
	buf := alloc(t, d, 4096, 4096)
	mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 8, Data: []frontend.Buffer{buf}, Tag: 1})
	if err := tc.srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Dead():
	case <-time.After(wait):
		t.Fatal("the frontend did not see the server go")
	}
	// Requests submitted while no server runs.
	for i := range 4 {
		buf.Bytes[0] = byte(i + 1)
		if err := q.Submit(frontend.Request{Type: proto.BlkTOut, Sector: uint64(16 + 8*i), Data: []frontend.Buffer{buf.Slice(0, 512)}, Tag: uint64(100 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	tc.serve()
	if err := d.Reconnect(); err != nil {
		t.Fatal(err)
	}
	if err := q.Kick(); err != nil {
		t.Fatal(err)
	}
	if done := collectOK(t, q, 4); done != 4 {
		t.Fatalf("%d of 4 requests completed after the reconnect", done)
	}
	if st := tc.srv.Stats(); st.Connects != 1 || st.Write.Requests != 4 {
		t.Errorf("stats after the reconnect %+v", st)
	}
	if err := tc.disk.Truncate(2 * diskSize); err != nil {
		t.Fatal(err)
	}
	tc.srv.ConfigChanged()
	select {
	case <-d.ConfigChanges():
	case <-time.After(wait):
		t.Fatal("no config change reached the frontend")
	}
	cfg, err := d.RefreshConfig()
	if err != nil || cfg.Capacity != 2*diskSize/512 {
		t.Fatalf("config after resize: %+v, %v", cfg, err)
	}
}

// gatedDisk holds every write at a gate until released (then fails it
// without writing), and plans nothing: a server that hangs with requests
// taken, as one killed with -9 leaves them.
type gatedDisk struct {
	*Disk
	gate chan struct{}
}

func (g *gatedDisk) NewIO(cq door.Completions) blk.IO { return declineIO{} }

func (g *gatedDisk) WriteAt(p []byte, off int64) (int, error) {
	<-g.gate
	return 0, errors.New("gated")
}

type declineIO struct{}

func (declineIO) Start([]byte, int64, bool, int) bool { return false }
func (declineIO) Plan() door.Plan                     { return nil }
func (declineIO) End(bool)                            {}

// TestInflightResubmit: a server takes writes and never completes them;
// a new server on the same socket, handed the inflight region by the
// frontend's reconnect, resubmits and completes them, and the disk holds
// them.
func TestInflightResubmit(t *testing.T) {
	tc := newMemCase(t)
	if err := tc.srv.Close(); err != nil {
		t.Fatal(err)
	}
	g := &gatedDisk{Disk: New(tc.store, tc.disk), gate: make(chan struct{})}
	hung, err := blk.Serve(g, blk.Config{Socket: tc.socket, ID: "vm0", Queues: 2, SocketGroup: -1, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	d := tc.dial(frontend.Options{})
	t.Cleanup(func() { // after the frontend is gone (cleanups run last first)
		close(g.gate)
		hung.Close()
	})
	q := d.Queues()[1]
	const n = 4
	buf := alloc(t, d, n*4096, 4096)
	for i := range n {
		b := buf.Slice(i*4096, 4096)
		for j := range b.Bytes {
			b.Bytes[j] = byte(i + 1)
		}
		if err := q.Submit(frontend.Request{Type: proto.BlkTOut, Sector: uint64(8 * i), Data: []frontend.Buffer{b}, Tag: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Kick(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(wait); hung.Stats().Inflight != n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server took %d of %d requests", hung.Stats().Inflight, n)
		}
	}
	// The hung server's socket goes, as a dead daemon's does; a new one
	// listens there.
	if err := os.Remove(tc.socket); err != nil {
		t.Fatal(err)
	}
	tc.serve()
	if err := d.Reconnect(); err != nil {
		t.Fatal(err)
	}
	if done := collectOK(t, q, n); done != n {
		t.Fatalf("%d of %d requests completed after the restart", done, n)
	}
	if st := tc.srv.Stats(); st.Resubmitted != n || st.Write.Requests != n {
		t.Errorf("new server's stats %+v", st)
	}
	got := make([]byte, n*4096)
	if _, err := tc.disk.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != byte(i/4096+1) {
			t.Fatalf("byte %d is %d after the resubmission", i, got[i])
		}
	}
}

// TestBadDescriptors: requests whose buffers lie outside the shared
// memory, overlap, or come in the wrong direction are answered IOERR and
// counted; the queue goes on serving good requests.
func TestBadDescriptors(t *testing.T) {
	tc := newMemCase(t)
	d := tc.dial(frontend.Options{})
	q := d.Queues()[0]
	good := alloc(t, d, 8192, 4096)
	outside := frontend.Buffer{Addr: 1 << 40, Bytes: good.Bytes[:4096]}
	wraps := frontend.Buffer{Addr: ^uint64(0) - 100, Bytes: good.Bytes[:4096]}
	for i, data := range [][]frontend.Buffer{
		{outside},
		{good.Slice(0, 4096), wraps},
		{good.Slice(0, 4096), good.Slice(2048, 4096)}, // overlap
	} {
		for _, typ := range []uint32{proto.BlkTIn, proto.BlkTOut} {
			if c := do(t, q, frontend.Request{Type: typ, Sector: 0, Data: data, Tag: uint64(i)}); c.Status != proto.BlkSIOErr {
				t.Errorf("case %d type %d: status %d, want IOERR", i, typ, c.Status)
			}
		}
	}
	mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 0, Data: []frontend.Buffer{good}, Tag: 9})
	if st := tc.srv.Stats(); st.Bad != 6 {
		t.Errorf("%d bad requests counted, want 6", st.Bad)
	}
}

// failingCommits is a disk whose writes are never recoverable without a
// commit, and whose commits fail.
type failingCommits struct{ *Disk }

func (failingCommits) WritesRecoverable() bool { return false }
func (failingCommits) CommitWrites() error     { return errors.New("commit failed") }

// TestHeldWrites: a write that needs a commit is returned only after one,
// and IOERR when the commit fails; reads are not held.
func TestHeldWrites(t *testing.T) {
	tc := newMemCase(t)
	if err := tc.srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv, err := blk.Serve(failingCommits{New(tc.store, tc.disk)}, blk.Config{Socket: tc.socket, ID: "vm0", Queues: 1, SocketGroup: -1, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	tc.srv = srv
	d := tc.dial(frontend.Options{})
	q := d.Queues()[0]
	buf := alloc(t, d, 4096, 4096)
	if c := do(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 8, Data: []frontend.Buffer{buf}, Tag: 1}); c.Status != proto.BlkSIOErr {
		t.Errorf("write whose commit failed: status %d", c.Status)
	}
	mustOK(t, q, frontend.Request{Type: proto.BlkTIn, Sector: 8, Data: []frontend.Buffer{buf}, Tag: 2})
	if st := srv.Stats(); st.Held != 1 || st.Write.Errors != 1 || st.Read.Requests != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestBadChains sends hand-made chains: a loop, a readable buffer after
// a writable one, data in the wrong direction, a next past the table.
// Each is answered (IOERR in its status byte where the chain has one the
// device reached), and the queue goes on.
func TestBadChains(t *testing.T) {
	tc := newMemCase(t)
	d := tc.dial(frontend.Options{})
	q := d.Queues()[0]
	hdr := alloc(t, d, 16, 16)
	data := alloc(t, d, 4096, 4096)
	status := alloc(t, d, 1, 1)
	out := func(typ uint32) {
		proto.BlkOutHdr{Type: typ, Sector: 8}.Put(hdr.Bytes)
	}
	desc := func(b frontend.Buffer, flags, next uint16) proto.Desc {
		return proto.Desc{Addr: b.Addr, Len: uint32(b.Len()), Flags: flags, Next: next}
	}
	const next, write = proto.DescFNext, proto.DescFWrite
	for i, c := range []struct {
		name   string
		typ    uint32
		descs  []proto.Desc
		answer bool // the status byte is reached: IOERR expected there
	}{
		{"loop", proto.BlkTOut, []proto.Desc{desc(hdr, next, 1), desc(data, next, 2), desc(status, write|next, 0)}, true},
		{"readable after writable", proto.BlkTOut, []proto.Desc{desc(hdr, next, 1), desc(status, write|next, 2), desc(data, 0, 0)}, true},
		{"read into readable data", proto.BlkTIn, []proto.Desc{desc(hdr, next, 1), desc(data, next, 2), desc(status, write, 0)}, true},
		{"write from writable data", proto.BlkTOut, []proto.Desc{desc(hdr, next, 1), desc(data, write|next, 2), desc(status, write, 0)}, true},
		{"next past the table", proto.BlkTOut, []proto.Desc{desc(hdr, next, 999)}, false},
	} {
		out(c.typ)
		status.Bytes[0] = 0xff
		if err := q.SubmitChain(c.descs, uint64(i)); err != nil {
			t.Fatal(err)
		}
		if err := q.Kick(); err != nil {
			t.Fatal(err)
		}
		got := 0
		for deadline := time.Now().Add(wait); got == 0 && time.Now().Before(deadline); {
			n, err := q.Poll(func(frontend.Completion) {})
			if err != nil {
				t.Fatal(err)
			}
			if got = n; got == 0 {
				q.Wait(100 * time.Millisecond)
			}
		}
		if got != 1 {
			t.Fatalf("%s: %d completions", c.name, got)
		}
		if c.answer && status.Bytes[0] != proto.BlkSIOErr {
			t.Errorf("%s: status %d, want IOERR", c.name, status.Bytes[0])
		}
	}
	mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: 0, Data: []frontend.Buffer{data}, Tag: 99})
}
