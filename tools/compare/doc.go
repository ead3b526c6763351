// Command compare measures a vdiskfs disk against a plain file served by a
// go-fuse pass-through with the same FUSE settings, on the same backing,
// with the same fio jobs, alternating the targets round after round so
// that drift of the machine hits both alike.
//
// It is a Go module of its own (its chart needs a plotting stack that
// vdisk does not); `make compare` builds bin/compare. Usage (as root, fio
// installed):
//
//	bin/compare                                # default workloads, 3 rounds
//	bin/compare --targets all \
//	    --json docs/benchmarks.json --markdown /tmp/table.md --chart docs/benchmarks.png
//	bin/compare --mount /mnt/vdisks --scratch /var/tmp/cmp
//	bin/compare --binary old=/tmp/vdisk-old --binary new=bin/vdisk \
//	    --targets old,new,raw --baseline old   # two builds and the raw file
//	bin/compare --jobs tools/compare/jobs/syncwrite.fio --targets vdiskfs,raw --baseline raw
//	bin/compare --rbd-pool rbd --binary new=bin/vdisk \
//	    --targets librbd,new --baseline librbd  # a store on RBD against librbd
//	bin/compare --from-json bench.json --chart bench.svg
//
// # Targets
//
//   - vdiskfs: by default a store formatted in the scratch directory (or
//     --store PATH), opened and mounted by this process with fs.Mount, so
//     its counters (image.Store.Counters) are read directly. With --mount
//     MNT, a disk in an existing vdiskfs mount instead; its counters then
//     come from `vdisk stats --json MNT` when that works (else n/a), its CPU
//     from the daemon's pid (the one vdisk stats reports, or --server-pid).
//   - passthrough: a plain file in the scratch directory, served by package
//     passthrough (one pread/pwrite per FUSE request, same mount options and
//     open flags as vdiskfs). The baseline of every ratio.
//   - raw: fio on a plain file in the scratch directory, no FUSE at all.
//   - qsd-qcow2: a qcow2 image in the scratch directory exported through
//     qemu-storage-daemon's FUSE export (cache.direct=on, aio=native): what
//     users would pick instead of vdiskfs.
//   - vhost: a vdiskfs disk on a vhost-user-blk socket, driven by the load
//     generator (package loadgen) through the Go frontend
//     (vhostuser/frontend), one queue, as fio's one-thread jobs. By default
//     the vdisk binary (--vdisk) formats and mounts a store as for
//     --binary and serves the disk with `vdisk vhost-user MNT/NAME SOCK`;
//     with --vhost-socket SOCK --vhost-file MNT/NAME, a disk served
//     already (its daemon's CPU from --server-pid).
//   - qsd-vhost: a raw file in the scratch directory exported by
//     qemu-storage-daemon as vhost-user-blk (cache.direct=on,
//     aio=io_uring, one queue), driven by the same generator: the peer of
//     the vhost target. Its CPU is the daemon's.
//   - raw-uring: the raw target's file driven by the same generator
//     through io_uring, O_DIRECT: the generator's calibration, to be read
//     against raw (fio) on the same shapes.
//   - NAME, for each --binary NAME=PATH: a store formatted in the scratch
//     directory by the vdisk binary PATH and mounted by it as a user runs
//     it (`vdisk mount STORE MNT`, the daemon in the background, its
//     defaults); counters and CPU as for --mount. Several --binary targets
//     measure builds side by side, in the same alternating rounds.
//   - NAME, for each --vhost-binary NAME=PATH: as vhost, with the vdisk
//     binary PATH: builds side by side on the vhost-user door.
//   - librbd, with --rbd-pool POOL: fio's rbd engine (librbd's
//     asynchronous API, no FUSE, no mapping) on an image of POOL that the
//     tool creates with the rbd command and removes, librbd's cache off in
//     the image's configuration: the raw side of a store on RBD. With
//     --rbd-pool the stores of the --binary, --vhost-binary and vhost
//     targets are images of POOL too (their vdisk built with `make build
//     TAGS=rbd`), and the in-process and guest targets are refused. Every
//     RBD client finds the cluster through CEPH_CONF (`eval
//     "$(tools/ceph/cluster.sh start)"` runs a one-node one).
//   - guest-vhost and guest-file, given alone (not with the targets above):
//     fio inside one QEMU guest under TCG (internal/tcgguest: Debian's
//     kernel, busybox, and the host's fio with its libraries in the
//     initramfs), on two disks of one store that --vdisk formats and
//     mounts: guest-vhost is a disk on its vhost-user-blk socket, and
//     guest-file another disk whose file QEMU opens itself (cache=none,
//     aio=io_uring); both with a queue per vCPU. The guest's /init fills
//     each disk once, runs the rounds with the disks alternating as above,
//     flushes the disk after each run and prints fio's JSON on the serial
//     console; the host takes the daemon's counters and CPU, and the
//     device's, at the markers around each run. The figures are the
//     guest's: under TCG they say how the two ways into one store compare,
//     not what a guest under KVM gets. Workloads must not be fresh or
//     after another.
//
// The scratch directory must be on the same backing as the store (it is by
// default) and not on tmpfs.
//
// With --hugepages, the I/O buffers of the host's targets are on 2 MiB
// hugetlb pages, as a VM's are when its memory is on huge pages: the
// vhost targets' guest memory (one memfd, MFD_HUGETLB), raw-uring's
// buffers, and fio's (iomem=shmhuge). The kernel's pool must have them
// free (sysctl vm.nr_hugepages; 128 covers the vhost job file). Without
// it the buffers are on base pages, where a 1 MiB buffer is scattered in
// physical memory and a virtual disk below may take it as more than one
// request (the device KiB column says).
//
// # Workloads
//
// The generator targets read each fio job's shape (rw, bs, iodepth,
// runtime, ramp_time, time_based, randseed) and refuse a job with options
// the generator does not reproduce. Their "fio CPU" column is the
// generator's (this process's) CPU.
//
// The built-in job file (--print-jobs) holds the seeds' workloads; --jobs
// FILE runs another fio job file, each job section a workload, and
// --workloads picks some by name. Workloads other than the first write into
// thin space run on targets written once from end to end (the tool fills
// them first, unmeasured). After every run the tool fsyncs the target and
// waits --settle, outside the measured window.
//
// # Figures
//
// Per workload and target, medians over the rounds (and MB/s min–max):
// MB/s (10^6 B/s), IOPS, p50 and p99 latency (fio, submission to
// completion), the average FUSE request size, the server's backend I/O
// rate and average size, the backing device's I/O rate and average size
// (/proc/diskstats, shared with every process on the machine), the serving
// process's CPU seconds per GB served and microseconds per request, fio's
// own CPU per GB, the ratio of the MB/s medians to the baseline's, and
// the per-round ratio: median (min–max) over the rounds of each round's
// MB/s over the baseline's in the same round, the one to read on a noisy
// machine. Output: a table on stdout, --markdown, --json (every run too;
// --from-json renders it again, with --baseline against another of its
// targets) and --chart (PNG or SVG).
//
// docs/BENCHMARKS.md has the current run, the command that made it and how
// to read it.
//
// Exit codes: 0 done; 1 a run or the setup failed; 2 bad usage; 3 a
// prerequisite (fio, qemu-storage-daemon, qemu-system-x86_64, rbd) is
// missing.
package main
