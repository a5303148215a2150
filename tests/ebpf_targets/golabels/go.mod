module proflow.invalid/ebpftargetlabels

go 1.24
