module proflow.invalid/ebpftarget

go 1.21
