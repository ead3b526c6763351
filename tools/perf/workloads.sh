# Sourced by tools/perf/ab.sh, vsraw.sh and rbd.sh: the four workloads
# every paired comparison here runs by default, the two more of issue 17's
# large writes, and what fio options each is.
default_workloads="seqwrite-1m-qd16 seqread-1m-qd16 randread-4k-qd32 randwrite-4k-qd32"
large_writes="seqwrite-1m-qd1 seqwrite-1m-qd16 write-256k-qd64"

# workload_args NAME: the fio --rw, --bs and --iodepth of workload NAME.
workload_args() {
	case $1 in
	seqwrite-1m-qd1) echo --rw=write --bs=1M --iodepth=1 ;;
	seqwrite-1m-qd16) echo --rw=write --bs=1M --iodepth=16 ;;
	write-256k-qd64) echo --rw=write --bs=256k --iodepth=64 ;;
	seqread-1m-qd16) echo --rw=read --bs=1M --iodepth=16 ;;
	randread-4k-qd32) echo --rw=randread --bs=4k --iodepth=32 ;;
	randwrite-4k-qd32) echo --rw=randwrite --bs=4k --iodepth=32 ;;
	*) echo "unknown workload $1 (want one of $default_workloads $large_writes)" >&2; return 1 ;;
	esac
}
