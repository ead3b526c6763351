# Sourced by tools/perf/ab.sh and rbd.sh: the four workloads every paired
# comparison here runs, and what fio options each is.
default_workloads="seqwrite-1m-qd16 seqread-1m-qd16 randread-4k-qd32 randwrite-4k-qd32"

# workload_args NAME: the fio --rw, --bs and --iodepth of workload NAME.
workload_args() {
	case $1 in
	seqwrite-1m-qd16) echo --rw=write --bs=1M --iodepth=16 ;;
	seqread-1m-qd16) echo --rw=read --bs=1M --iodepth=16 ;;
	randread-4k-qd32) echo --rw=randread --bs=4k --iodepth=32 ;;
	randwrite-4k-qd32) echo --rw=randwrite --bs=4k --iodepth=32 ;;
	*) echo "unknown workload $1 (want one of $default_workloads)" >&2; return 1 ;;
	esac
}
