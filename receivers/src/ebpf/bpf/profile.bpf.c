// SPDX-License-Identifier: GPL-2.0-only
//
// proflow's CPU sampler: runs on every tick of a cpu-clock perf event on
// every CPU and sends one record per sample to user space through a ring
// buffer: who ran (tgid, tid, process start time, comm, executable name),
// the kernel stack, the user stack walked by frame pointers, and the user
// registers with a bounded copy of the user stack, so that user space can
// unwind code built without frame pointers from its .eh_frame.
//
// Interpreters whose frames are a chain in memory (processes user space put
// in `interp_procs`, with the struct offsets of their version): CPython 3.8
// to 3.13, from `_PyRuntime` to the thread state whose thread id is the
// thread's `pthread_self` (its fs base), then its frame chain; PHP 8.2, from
// `executor_globals.current_execute_data` (one thread per process); Perl
// 5.36, the context stacks of its first interpreter (`PL_curinterp`); Ruby
// 3.1, the control frames of the VM's main thread. At most
// INTERP_FRAMES frames, each as its code object's (or function's) address,
// where in it the thread is, and one byte that tells where a call of the
// interpreter's loop ends. User space names them and merges them with the
// native stack at the interpreter's evaluation function.
//
// Go (processes user space put in `go_procs`): the pprof labels of the
// goroutine the thread runs (`runtime/pprof.Do`, Go 1.24 on: a sorted slice
// of key/value strings), from the thread's g (its TLS slot, at the offset the
// binary's TLS segment gives), its m's `curg`, that g's `labels`. At most
// GO_LABELS labels, each key and value cut to their fields' length, sent in
// the place of the interpreter frames (a Go process has none).
//
// Off-CPU (when user space asks for it), from tracepoints only (kernels
// without kprobes or BPF trampolines have them): at `sched_switch`, a user
// thread that leaves the CPU to wait (not a preempted one) is noted with
// the time and its kernel stack, and one that runs again gets how long it
// was off. The record is sent from the thread itself when its system call
// returns (`sys_exit`), with its user stack, which has not changed since it
// blocked: if it waited at least `offcpu_threshold_ns`, and while the CPU's
// budget of `offcpu_max_rate` records a second lasts. A wait outside a
// system call (a page fault) is dropped at the thread's next `sys_enter`.
// Processes user space does not profile are put in `offcpu_skip` after
// their first record, and their waits are not noted from then on.
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

struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct {
	struct thread_struct thread;
	unsigned int __state;
	int pid;
	int tgid;
	unsigned int flags;
	struct mm_struct *mm;
	struct task_struct *group_leader;
	__u64 start_time;
} __attribute__((preserve_access_index));

#define INTERP_FRAMES 64        /* interpreter frames walked at most */
#define PY_THREADS 32           /* thread states looked at to find the thread's */

/* One interpreter frame as read: its code object (PHP: its function), where
 * in it the thread is (the 8 bytes at the walk's `frame_instr`: f_lasti, an
 * int, in CPython 3.8 to 3.10; the instruction pointer from 3.11 on; PHP: the
 * opline), and the byte at `frame_end` (3.11: is_entry; 3.12 on: owner; PHP:
 * bits 16 to 23 of the call info). User space makes sense of them by layout. */
struct interp_frame {
	__u64 code;
	__u64 instr;
	__u8 end;
	__u8 pad[7];
};

#define GO_LABELS 10            /* pprof labels read at most */
#define GO_KEY_LEN 32
#define GO_VALUE_LEN 112

/* One pprof label: its key's and value's lengths in the process (longer
 * than the fields: cut), and their first bytes. */
struct go_label {
	__u32 key_len;
	__u32 value_len;
	__u8 key[GO_KEY_LEN];
	__u8 value[GO_VALUE_LEN];
};

/* A Go process: where its g is (fs base + tls_g) and the offsets to the
 * running goroutine's labels, from its version or its DWARF. */
struct go_proc {
	__u64 start_time;           /* the process's: a reused pid is not it */
	__s64 tls_g;                /* the g's TLS slot from the fs base (-8 unless linked externally) */
	__u32 g_m;                  /* runtime.g: m */
	__u32 m_curg;               /* runtime.m: curg */
	__u32 g_labels;             /* runtime.g: labels (a *labelMap) */
	__u32 pad;
};

#define START_THREAD_STATES 0   /* CPython: find the thread's state first */
#define START_GLOBAL 1          /* the current frame's pointer is at runtime + tstate_frame */
#define START_PERL 2            /* Perl's context stacks, from the interpreter at *runtime */

/* Perl (START_PERL): the first entry is the current COP (code 0, instr
 * PL_curcop, end PERL_CURCOP); then, innermost first, each context of each
 * stack (end: its type byte; code: the 8 bytes where a sub's CV is; instr:
 * the COP it was entered from), and before the contexts of each outer stack
 * a marker (end PERL_STACK, code: that stack's si_type). The struct's
 * fields hold Perl's offsets, named in the comments of `struct interp_proc`. */
/* Ruby (START_RUBY): the main thread's control frames, innermost first: code
 * the frame's iseq, instr its pc, end the low byte of its ep[0] (the frame's
 * flags: VM_FRAME_FLAG_FINISH, VM_FRAME_FLAG_CFRAME). */
#define START_RUBY 3
#define PERL_CURCOP 0xfe
#define PERL_STACK 0xff

/* An interpreter process (user space fills it from the interpreter's symbols
 * and the version's layout): where its state is, and the offsets to walk. */
struct interp_proc {
	__u64 start_time;           /* the process's: a reused pid is not it */
	__u64 runtime;              /* address of _PyRuntime (PHP: executor_globals) */
	__u32 layout;               /* for user space: which version's frames */
	__u32 runtime_interp;       /* _PyRuntimeState: interpreters.head; Perl: si_type */
	__u32 interp_threads;       /* PyInterpreterState: the first thread state; Perl: Icurstackinfo; Ruby: vm's ractor.main_thread */
	__u32 tstate_next;          /* PyThreadState: next; Perl: si_prev; Ruby: ec's vm_stack */
	__u32 tstate_thread_id;     /* PyThreadState: thread_id (pthread_self); Perl: Icurcop; Ruby: thread's ec */
	__u32 tstate_frame;         /* PyThreadState: frame, cframe or current_frame; PHP: current_execute_data; Perl: si_cxstack; Ruby: ec's cfp */
	__s32 cframe_frame;         /* _PyCFrame: current_frame (-1: no cframe); Perl: si_cxix; Ruby: ec's vm_stack_size */
	__u32 frame_code;           /* the frame's code object (PHP: func; Perl: blk_sub.cv; Ruby: iseq) */
	__u32 frame_back;           /* the caller's frame; Perl, Ruby: the frame's size */
	__u32 frame_instr;          /* f_lasti (int), the instruction pointer, the opline; Perl: blk_oldcop; Ruby: pc */
	__u32 frame_end;            /* is_entry, owner or call info (a byte); 0: none; Perl: the type byte; Ruby: ep */
	__u32 start;                /* START_* */
};

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
	__u64 off_cpu_ns;           /* SAMPLE_OFF_CPU: how long it waited */
	__u32 interp_frames;        /* entries of `interp` (SAMPLE_GO_LABELS: `go_labels`) filled */
	__u32 interp_pad;
	union {
		struct interp_frame interp[INTERP_FRAMES]; /* the thread's interpreter frames, innermost first */
		struct go_label go_labels[GO_LABELS];     /* SAMPLE_GO_LABELS: its goroutine's labels */
	};
	__u64 kernel[MAX_FRAMES];
	__u64 user[MAX_FRAMES];
	__u8 stack[STACK_COPY + PAGE]; /* slack for the verifier; at most STACK_COPY used */
};

#define SAMPLE_KTHREAD 1        /* a kernel thread: no user part */
#define SAMPLE_IN_KERNEL 2      /* interrupted in kernel mode */
#define SAMPLE_OFF_CPU 4        /* a wait, not a tick: `off_cpu_ns` says how long */
#define SAMPLE_GO_LABELS 8      /* `go_labels` holds the goroutine's pprof labels */

/* Counters, one slot each per CPU, summed by user space. */
enum {
	COUNT_SAMPLES = 0,  /* perf ticks seen, idle excluded */
	COUNT_LOST,         /* records the ring buffer had no room for */
	COUNT_IDLE,         /* ticks on an idle CPU (pid 0), not sent */
	COUNT_NO_REGS,      /* user registers could not be read */
	COUNT_OFFCPU,       /* waits at least the threshold long, sent */
	COUNT_OFFCPU_RATE,  /* waits at least the threshold long, over the rate: not sent */
	COUNT_OFFCPU_UNTRACKED, /* waits not noted: the table of waiting threads was full */
	COUNT_OFFCPU_NO_SYSCALL, /* waits outside a system call: not sent */
	COUNT_MAX,
};

/* Set by user space before loading. */
volatile const __u64 offcpu_threshold_ns = 1000000;
volatile const __u64 offcpu_max_rate = 0; /* records a second per CPU; 0: off-CPU is off */

#define TASK_RUNNING 0
#define NS_PER_SEC 1000000000ULL
#define MAX_WAITING 16384

#define WAIT_FRAMES 32

/* A thread's wait: when it left the CPU, how long it was off once it runs
 * again (0 before), and the kernel stack where it blocked. */
struct wait {
	__u64 since;
	__u64 waited;
	__s32 kernel_bytes;
	__u32 pad;
	__u64 kernel[WAIT_FRAMES];
};

/* Waits by thread id; the least recently used goes when full (a thread that
 * exits while waiting never comes back for its entry). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_WAITING);
	__type(key, __u32);
	__type(value, struct wait);
} waiting SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct wait);
} wait_scratch SEC(".maps");

/* A process: its pid and start time (a reused pid is another process). */
struct proc_key {
	__u32 tgid;
	__u32 pad;
	__u64 start_time;
};

/* Processes user space does not profile (its relabelling dropped them):
 * their waits are not noted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_WAITING);
	__type(key, struct proc_key);
	__type(value, __u8);
} offcpu_skip SEC(".maps");

/* Each CPU's off-CPU budget: records left, and the second it is for. */
struct budget {
	__u64 second;
	__u64 left;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct budget);
} offcpu_budget SEC(".maps");

/* Interpreter processes by pid, put and taken away by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct interp_proc);
} interp_procs SEC(".maps");

/* Go processes by pid, put and taken away by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct go_proc);
} go_procs SEC(".maps");

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

/* The off-CPU records' own: a perf sample (an NMI) may come in the middle
 * of writing one, and must not write over it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample);
} offcpu_scratch SEC(".maps");

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

/* 0 when unreadable (the helper zeroes on failure). */
static __always_inline __u64 read_ptr(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* The sub calls of the main thread of a Perl process (see START_PERL): its
 * interpreter is *runtime (PL_curinterp: a program's first interpreter). The
 * contexts of each stack are an array walked from its top (si_cxix) down;
 * the stacks a chain (si_prev). One loop of INTERP_FRAMES steps, each an
 * entry or a step to the next stack. */
static __always_inline void perl_stack(struct sample *s, struct interp_proc *p)
{
	__u64 interp = read_ptr(p->runtime);
	__u64 si, cxstack;
	__s32 ix = -1;
	__u32 n = 0;

	if (!interp)
		return;
	si = read_ptr(interp + p->interp_threads);
	if (!si)
		return;
	s->interp[0].code = 0;
	s->interp[0].instr = read_ptr(interp + p->tstate_thread_id);
	s->interp[0].end = PERL_CURCOP;
	n = 1;
	cxstack = read_ptr(si + p->tstate_frame);
	bpf_probe_read_user(&ix, sizeof(ix), (void *)(si + (__u32)p->cframe_frame));
	for (int i = 0; i < INTERP_FRAMES; i++) {
		struct interp_frame *f;
		__u64 cx;

		if (n >= INTERP_FRAMES)
			break;
		f = &s->interp[n & (INTERP_FRAMES - 1)];
		if (ix < 0) {
			__u32 type = 0;

			si = read_ptr(si + p->tstate_next);
			if (!si)
				break;
			cxstack = read_ptr(si + p->tstate_frame);
			ix = -1;
			bpf_probe_read_user(&ix, sizeof(ix), (void *)(si + (__u32)p->cframe_frame));
			bpf_probe_read_user(&type, sizeof(type), (void *)(si + p->runtime_interp));
			f->code = type;
			f->instr = 0;
			f->end = PERL_STACK;
			n++;
			continue;
		}
		if (ix > 0xffff || !cxstack)
			break;
		cx = cxstack + (__u64)ix * p->frame_back;
		f->code = read_ptr(cx + p->frame_code);
		f->instr = read_ptr(cx + p->frame_instr);
		f->end = 0;
		bpf_probe_read_user(&f->end, 1, (void *)(cx + p->frame_end));
		n++;
		ix--;
	}
	s->interp_frames = n;
}

/* The control frames of the main thread of a Ruby process (see START_RUBY):
 * *runtime is the VM (ruby_current_vm_ptr), its main thread's execution
 * context holds the current frame (cfp); frames go up in memory from it to
 * the end of the VM stack (vm_stack + vm_stack_size VALUEs). */
static __always_inline void ruby_stack(struct sample *s, struct interp_proc *p)
{
	__u64 vm = read_ptr(p->runtime);
	__u64 th = vm ? read_ptr(vm + p->interp_threads) : 0;
	__u64 ec = th ? read_ptr(th + p->tstate_thread_id) : 0;
	__u64 cfp, end;
	__u32 n = 0;

	if (!ec)
		return;
	cfp = read_ptr(ec + p->tstate_frame);
	end = read_ptr(ec + p->tstate_next) + read_ptr(ec + (__u32)p->cframe_frame) * 8;
	for (int i = 0; i < INTERP_FRAMES; i++) {
		struct interp_frame *f = &s->interp[i];
		__u64 ep;

		if (!cfp || cfp >= end)
			break;
		f->code = read_ptr(cfp + p->frame_code);
		f->instr = read_ptr(cfp + p->frame_instr);
		f->end = 0;
		ep = read_ptr(cfp + p->frame_end);
		if (ep)
			bpf_probe_read_user(&f->end, 1, (void *)ep);
		n = i + 1;
		cfp += p->frame_back;
	}
	s->interp_frames = n;
}

/* The current thread's interpreter frames, when its process runs a known
 * interpreter. CPython: its thread state is the one whose thread id is its fs
 * base (glibc's and musl's pthread_self on x86_64); PHP: the current frame's
 * pointer is global. The frame loop has no branch but its end, so that the
 * verifier's work stays linear in INTERP_FRAMES. */
static __always_inline void interp_stack(struct sample *s, struct task_struct *task)
{
	struct interp_proc *p = bpf_map_lookup_elem(&interp_procs, &s->tgid);
	__u64 fsbase, tstate, frame, interp;
	__u32 n = 0;
	int found = 0;

	if (!p || p->start_time != s->start_time)
		return;
	if (p->start == START_RUBY) {
		/* the main thread's frames (with the GVL, one thread runs Ruby at a
		 * time; the others' are not walked) */
		if (s->tid == s->tgid)
			ruby_stack(s, p);
		return;
	}
	if (p->start == START_PERL) {
		/* PL_curinterp is the main thread's (other threads have their
		 * own interpreters, not walked) */
		if (s->tid == s->tgid)
			perl_stack(s, p);
		return;
	}
	if (p->start == START_GLOBAL) {
		/* PHP without threads runs PHP in its main thread only (helper
		 * threads of extensions have no PHP frames) */
		if (s->tid != s->tgid)
			return;
		frame = read_ptr(p->runtime + p->tstate_frame);
	} else {
		fsbase = BPF_CORE_READ(task, thread.fsbase);
		interp = read_ptr(p->runtime + p->runtime_interp);
		if (!fsbase || !interp)
			return;
		tstate = read_ptr(interp + p->interp_threads);
		for (int i = 0; i < PY_THREADS; i++) {
			if (!tstate)
				break;
			if (read_ptr(tstate + p->tstate_thread_id) == fsbase) {
				found = 1;
				break;
			}
			tstate = read_ptr(tstate + p->tstate_next);
		}
		if (!found)
			return;
		frame = read_ptr(tstate + p->tstate_frame);
		if (p->cframe_frame >= 0 && frame)
			frame = read_ptr(frame + (__u32)p->cframe_frame);
	}
	for (int i = 0; i < INTERP_FRAMES; i++) {
		struct interp_frame *f = &s->interp[i];

		if (!frame)
			break;
		f->code = read_ptr(frame + p->frame_code);
		f->instr = read_ptr(frame + p->frame_instr);
		f->end = 0;
		if (p->frame_end)
			bpf_probe_read_user(&f->end, 1, (void *)(frame + p->frame_end));
		n = i + 1;
		frame = read_ptr(frame + p->frame_back);
	}
	s->interp_frames = n;
}

/* The pprof labels of the goroutine the current thread runs, when its
 * process is a Go one: g from its TLS slot, then g->m->curg->labels, a
 * *labelMap whose first field is the slice of labels ({key, value}, two
 * strings of {pointer, length}). */
static __always_inline void go_labels(struct sample *s, struct task_struct *task)
{
	struct go_proc *p = bpf_map_lookup_elem(&go_procs, &s->tgid);
	__u64 fsbase, g, m, curg, labels, list, len;
	__u32 n = 0;

	if (!p || p->start_time != s->start_time)
		return;
	fsbase = BPF_CORE_READ(task, thread.fsbase);
	if (!fsbase)
		return;
	g = read_ptr(fsbase + p->tls_g);
	m = g ? read_ptr(g + p->g_m) : 0;
	curg = m ? read_ptr(m + p->m_curg) : 0;
	labels = curg ? read_ptr(curg + p->g_labels) : 0;
	if (!labels)
		return;
	list = read_ptr(labels);
	len = read_ptr(labels + 8);
	for (int i = 0; i < GO_LABELS; i++) {
		struct go_label *l = &s->go_labels[i];
		__u64 str[4] = {};
		__u32 k, v;

		if (i >= len)
			break;
		if (bpf_probe_read_user(str, sizeof(str), (void *)(list + (__u64)i * 32)) != 0)
			break;
		l->key_len = str[1] > 0xffffffff ? 0xffffffff : (__u32)str[1];
		l->value_len = str[3] > 0xffffffff ? 0xffffffff : (__u32)str[3];
		k = l->key_len < GO_KEY_LEN ? l->key_len : GO_KEY_LEN;
		v = l->value_len < GO_VALUE_LEN ? l->value_len : GO_VALUE_LEN;
		/* The verifier wants the sizes bounded in the registers passed:
		 * hide the clamps from clang, which would pass the unclamped
		 * copies, and bound them again (within the record either way). */
		asm volatile("" : "+r"(k), "+r"(v));
		k &= 63;  /* a power of two less one, above GO_KEY_LEN: no length changes */
		v &= 127; /* the same above GO_VALUE_LEN */
		if (bpf_probe_read_user(l->key, k, (void *)str[0]) != 0 ||
		    bpf_probe_read_user(l->value, v, (void *)str[2]) != 0)
			break;
		n = i + 1;
	}
	if (n) {
		s->interp_frames = n;
		s->flags |= SAMPLE_GO_LABELS;
	}
}

/* The user registers saved when the current task entered the kernel. */
static __always_inline void saved_user_regs(struct sample *s)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	s->flags |= SAMPLE_IN_KERNEL;
	if (bpf_probe_read_kernel(&s->ip, sizeof(s->ip), &regs->rip) != 0 ||
	    bpf_probe_read_kernel(&s->sp, sizeof(s->sp), &regs->rsp) != 0 ||
	    bpf_probe_read_kernel(&s->bp, sizeof(s->bp), &regs->rbp) != 0) {
		s->ip = s->sp = s->bp = 0;
		count(COUNT_NO_REGS);
	}
}

/* Fills the record of the current task and sends it: its user registers
 * from `perf_regs` when it was interrupted in user mode, else those saved
 * on kernel entry; its kernel stack here unless `kernel_filled`. */
static __always_inline void send(void *ctx, struct sample *s, __u64 id, struct pt_regs *perf_regs,
				 int kernel_filled)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 size, wakeup;

	s->tgid = id >> 32;
	s->tid = (__u32)id;
	s->start_time = BPF_CORE_READ(task, group_leader, start_time);
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	s->exe[0] = 0;
	s->ip = s->sp = s->bp = 0;
	s->stack_len = 0;
	s->user_bytes = 0;
	s->interp_frames = 0;

	if (!kernel_filled)
		s->kernel_bytes = bpf_get_stack(ctx, s->kernel, sizeof(s->kernel), 0);

	if (BPF_CORE_READ(task, flags) & PF_KTHREAD) {
		s->flags |= SAMPLE_KTHREAD;
	} else {
		const unsigned char *name = BPF_CORE_READ(task, mm, exe_file, f_path.dentry, d_name.name);
		if (name)
			bpf_probe_read_kernel_str(s->exe, sizeof(s->exe), name);
		s->user_bytes = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);

		if (perf_regs && (perf_regs->cs & 3)) {
			/* interrupted in user mode: these are the user registers */
			s->ip = perf_regs->rip;
			s->sp = perf_regs->rsp;
			s->bp = perf_regs->rbp;
		} else {
			saved_user_regs(s);
		}
		if (s->sp)
			s->stack_len = copy_stack(s, s->sp);
		interp_stack(s, task);
		if (!s->interp_frames)
			go_labels(s, task);
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
}

SEC("perf_event")
int sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	struct sample *s;

	if ((id >> 32) == 0) {
		count(COUNT_IDLE);
		return 0;
	}
	count(COUNT_SAMPLES);
	s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;
	s->flags = 0;
	s->off_cpu_ns = 0;
	send(ctx, s, id, (struct pt_regs *)&ctx->regs, 0);
	return 0;
}

/* sched_switch(preempt, prev, next): `next` runs again, so a wait of its
 * ends; `prev`, a user thread leaving the CPU to wait (its state is not
 * running: a preempted thread only waits for a CPU), begins one. */
SEC("tp_btf/sched_switch")
int offcpu_switch(__u64 *ctx)
{
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	struct wait *w;
	__u32 tid, zero = 0;
	__u64 now;

	if (offcpu_max_rate == 0)
		return 0;
	now = bpf_ktime_get_ns();
	tid = BPF_CORE_READ(next, pid);
	w = bpf_map_lookup_elem(&waiting, &tid);
	if (w && w->waited == 0)
		w->waited = now - w->since + 1;

	if (BPF_CORE_READ(prev, __state) == TASK_RUNNING)
		return 0;
	if (BPF_CORE_READ(prev, flags) & PF_KTHREAD)
		return 0;
	tid = BPF_CORE_READ(prev, pid);
	if (tid == 0 || BPF_CORE_READ(prev, tgid) == 0)
		return 0;
	{
		struct proc_key k = {
			.tgid = BPF_CORE_READ(prev, tgid),
			.start_time = BPF_CORE_READ(prev, group_leader, start_time),
		};
		if (bpf_map_lookup_elem(&offcpu_skip, &k))
			return 0;
	}
	w = bpf_map_lookup_elem(&wait_scratch, &zero);
	if (!w)
		return 0;
	w->since = now;
	w->waited = 0;
	w->kernel_bytes = bpf_get_stack(ctx, w->kernel, sizeof(w->kernel), 0);
	if (bpf_map_update_elem(&waiting, &tid, w, BPF_ANY) != 0)
		count(COUNT_OFFCPU_UNTRACKED);
	return 0;
}

/* A system call begins: a thread that waited since its last one waited
 * outside a system call (a page fault); its stack is gone, so is the wait. */
SEC("tp_btf/sys_enter")
int offcpu_enter(__u64 *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct wait *w;

	if (offcpu_max_rate == 0)
		return 0;
	w = bpf_map_lookup_elem(&waiting, &tid);
	if (w && w->waited) {
		bpf_map_delete_elem(&waiting, &tid);
		count(COUNT_OFFCPU_NO_SYSCALL);
	}
	return 0;
}

/* A system call returns, in the thread: if it waited in it, long enough,
 * and the CPU's budget allows, its record. */
SEC("tp_btf/sys_exit")
int offcpu_exit(__u64 *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, zero = 0;
	__u64 waited, second;
	struct budget *b;
	struct sample *s;
	struct wait *w;

	if (offcpu_max_rate == 0)
		return 0;
	w = bpf_map_lookup_elem(&waiting, &tid);
	if (!w || w->waited == 0)
		return 0;
	waited = w->waited;
	if (waited < offcpu_threshold_ns) {
		bpf_map_delete_elem(&waiting, &tid);
		return 0;
	}
	b = bpf_map_lookup_elem(&offcpu_budget, &zero);
	s = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	if (!b || !s) {
		bpf_map_delete_elem(&waiting, &tid);
		return 0;
	}
	second = bpf_ktime_get_ns() / NS_PER_SEC;
	if (b->second != second) {
		b->second = second;
		b->left = offcpu_max_rate;
	}
	if (b->left == 0) {
		bpf_map_delete_elem(&waiting, &tid);
		count(COUNT_OFFCPU_RATE);
		return 0;
	}
	b->left -= 1;
	s->kernel_bytes = w->kernel_bytes;
	if (bpf_probe_read_kernel(s->kernel, sizeof(w->kernel), w->kernel) != 0)
		s->kernel_bytes = 0;
	if (s->kernel_bytes > (__s32)sizeof(w->kernel))
		s->kernel_bytes = sizeof(w->kernel);
	bpf_map_delete_elem(&waiting, &tid);
	count(COUNT_OFFCPU);
	s->flags = SAMPLE_OFF_CPU;
	s->off_cpu_ns = waited;
	send(ctx, s, id, 0, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
