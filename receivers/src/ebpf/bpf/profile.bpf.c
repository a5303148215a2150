// SPDX-License-Identifier: GPL-2.0-only
//
// proflow's CPU sampler: runs on every tick of a cpu-clock perf event on
// every CPU and sends one record per sample to user space through a ring
// buffer: who ran (tgid, tid, process start time, comm, executable name),
// the kernel stack, the user stack walked by frame pointers, and the user
// registers with a bounded copy of the user stack, so that user space can
// unwind code built without frame pointers from its .eh_frame.
//
// Built by scripts/build-bpf (clang -target bpf -O2 -g, CO-RE): the object
// beside this file is committed and embedded in proflow, so building proflow
// needs no clang. The record layout is mirrored by receivers/src/ebpf/sample.rs;
// change both together.
//
// No vmlinux.h: the few kernel structures read below are declared here with
// only the fields used, and `preserve_access_index` makes clang emit CO-RE
// relocations, which the loader resolves against the running kernel's BTF.

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define MAX_FRAMES 127         /* the kernel's default perf_event_max_stack */
#define STACK_COPY 16384       /* bytes of user stack sent per sample */
#define PAGE 4096
#define PF_KTHREAD 0x00200000
#define TASK_COMM_LEN 16
#define EXE_NAME_LEN 32

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct mm_struct {
	struct file *exe_file;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int flags;
	struct mm_struct *mm;
	struct task_struct *group_leader;
	__u64 start_time;
} __attribute__((preserve_access_index));

/* One sample as user space reads it (receivers/src/ebpf/sample.rs). Only
 * the first `stack_len` bytes of `stack` are sent. */
struct sample {
	__u32 tgid;
	__u32 tid;
	__u64 start_time;           /* the process's start, ns since boot: tells a reused pid */
	__u8 comm[TASK_COMM_LEN];   /* the thread's name at sample time */
	__u8 exe[EXE_NAME_LEN];     /* the executable's file name at sample time */
	__s32 kernel_bytes;         /* bytes of `kernel` filled (or a negative error) */
	__s32 user_bytes;           /* bytes of `user` filled (or a negative error) */
	__u64 ip;                   /* user registers: instruction, stack and frame pointer */
	__u64 sp;
	__u64 bp;
	__u32 stack_len;            /* bytes of `stack` copied from sp upwards */
	__u32 flags;                /* SAMPLE_* */
	__u64 kernel[MAX_FRAMES];
	__u64 user[MAX_FRAMES];
	__u8 stack[STACK_COPY + PAGE]; /* slack for the verifier; at most STACK_COPY used */
};

#define SAMPLE_KTHREAD 1        /* a kernel thread: no user part */
#define SAMPLE_IN_KERNEL 2      /* interrupted in kernel mode */

/* Counters, one slot each per CPU, summed by user space. */
enum {
	COUNT_SAMPLES = 0,  /* perf ticks seen, idle excluded */
	COUNT_LOST,         /* records the ring buffer had no room for */
	COUNT_IDLE,         /* ticks on an idle CPU (pid 0), not sent */
	COUNT_NO_REGS,      /* user registers could not be read */
	COUNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 2 << 20); /* user space sets the size */
} samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &which);
	if (v)
		*v += 1;
}

/* Copies the user stack from sp upwards, a page at a time, stopping at the
 * first page that cannot be read (the top of the stack). */
static __always_inline __u32 copy_stack(struct sample *s, __u64 sp)
{
	__u64 first = PAGE - (sp & (PAGE - 1)); /* 1..PAGE: up to the next page */
	__u32 done = 0;

	if (first > PAGE)
		return 0;
	if (bpf_probe_read_user(s->stack, first, (void *)sp) != 0)
		return 0;
	done = first;
#pragma unroll
	for (int i = 0; i < STACK_COPY / PAGE - 1; i++) {
		__u64 off = first + (__u64)i * PAGE;
		if (off > STACK_COPY)
			break;
		if (bpf_probe_read_user(s->stack + off, PAGE, (void *)(sp + off)) != 0)
			break;
		done = off + PAGE;
	}
	return done;
}

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 zero = 0;
	struct task_struct *task;
	struct sample *s;
	__u64 size, wakeup;

	if (tgid == 0) {
		count(COUNT_IDLE);
		return 0;
	}
	count(COUNT_SAMPLES);
	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;

	task = (struct task_struct *)bpf_get_current_task();
	s->tgid = tgid;
	s->tid = (__u32)id;
	s->start_time = BPF_CORE_READ(task, group_leader, start_time);
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	s->exe[0] = 0;
	s->flags = 0;
	s->ip = s->sp = s->bp = 0;
	s->stack_len = 0;
	s->user_bytes = 0;

	s->kernel_bytes = bpf_get_stack(ctx, s->kernel, sizeof(s->kernel), 0);

	if (BPF_CORE_READ(task, flags) & PF_KTHREAD) {
		s->flags |= SAMPLE_KTHREAD;
	} else {
		const unsigned char *name = BPF_CORE_READ(task, mm, exe_file, f_path.dentry, d_name.name);
		if (name)
			bpf_probe_read_kernel_str(s->exe, sizeof(s->exe), name);
		s->user_bytes = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);

		if (ctx->regs.cs & 3) {
			/* interrupted in user mode: these are the user registers */
			s->ip = ctx->regs.rip;
			s->sp = ctx->regs.rsp;
			s->bp = ctx->regs.rbp;
		} else {
			/* in the kernel: the user registers saved on kernel entry */
			struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
			s->flags |= SAMPLE_IN_KERNEL;
			if (bpf_probe_read_kernel(&s->ip, sizeof(s->ip), &regs->rip) != 0 ||
			    bpf_probe_read_kernel(&s->sp, sizeof(s->sp), &regs->rsp) != 0 ||
			    bpf_probe_read_kernel(&s->bp, sizeof(s->bp), &regs->rbp) != 0) {
				s->ip = s->sp = s->bp = 0;
				count(COUNT_NO_REGS);
			}
		}
		if (s->sp)
			s->stack_len = copy_stack(s, s->sp);
	}

	size = __builtin_offsetof(struct sample, stack) + s->stack_len;
	if (size > sizeof(*s))
		size = sizeof(*s);
	/* User space drains the ring every 100 ms; it is woken early only when
	 * the ring is an eighth full, not for every sample. */
	wakeup = bpf_ringbuf_query(&samples, BPF_RB_AVAIL_DATA) >
			 bpf_ringbuf_query(&samples, BPF_RB_RING_SIZE) / 8 ?
		 BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(&samples, s, size, wakeup) != 0)
		count(COUNT_LOST);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
