//! One record of the BPF program (`bpf/profile.bpf.c`, `struct sample`), read
//! from the ring buffer's bytes. The layout is fixed by the C struct (x86_64,
//! little endian, natural alignment); [`Sample::parse`] checks every length
//! against the record before reading, so a short or inconsistent record is
//! refused rather than read past.

/// Frames the kernel writes at most per stack (`MAX_FRAMES`).
pub const MAX_FRAMES: usize = 127;
/// Bytes of user stack copied at most (`STACK_COPY`).
pub const STACK_COPY: usize = 16384;

const COMM_LEN: usize = 16;
const EXE_LEN: usize = 32;
// Offsets in `struct sample`.
const OFF_TGID: usize = 0;
const OFF_TID: usize = 4;
const OFF_START: usize = 8;
const OFF_COMM: usize = 16;
const OFF_EXE: usize = OFF_COMM + COMM_LEN; // 32
const OFF_KBYTES: usize = OFF_EXE + EXE_LEN; // 64
const OFF_UBYTES: usize = 68;
const OFF_IP: usize = 72;
const OFF_SP: usize = 80;
const OFF_BP: usize = 88;
const OFF_STACK_LEN: usize = 96;
const OFF_FLAGS: usize = 100;
const OFF_OFF_CPU: usize = 104;
const OFF_INTERP_FRAMES: usize = 112;
const OFF_INTERP: usize = 120;
const OFF_KERNEL: usize = OFF_INTERP + INTERP_FRAMES * INTERP_FRAME_LEN; // 1656
const OFF_USER: usize = OFF_KERNEL + MAX_FRAMES * 8; // 2672
/// Where the user stack copy starts: the fixed part's size.
pub const HEADER_LEN: usize = OFF_USER + MAX_FRAMES * 8; // 3688
/// Interpreter frames the BPF program walks at most (`INTERP_FRAMES`).
pub const INTERP_FRAMES: usize = 64;
/// Bytes of one `struct interp_frame`.
const INTERP_FRAME_LEN: usize = 24;

/// A kernel thread: no user part.
pub const FLAG_KTHREAD: u32 = 1;
/// A wait, not a tick: `off_cpu_ns` says how long.
pub const FLAG_OFF_CPU: u32 = 4;
/// The interpreter frames' place holds the goroutine's pprof labels.
pub const FLAG_GO_LABELS: u32 = 8;
/// pprof labels the BPF program reads at most (`GO_LABELS`), and the bytes
/// of each key and value it keeps (`GO_KEY_LEN`, `GO_VALUE_LEN`).
pub const GO_LABELS: usize = 10;
pub const GO_KEY_LEN: usize = 32;
pub const GO_VALUE_LEN: usize = 112;
/// Bytes of one `struct go_label`.
const GO_LABEL_LEN: usize = 8 + GO_KEY_LEN + GO_VALUE_LEN;

// The labels share the interpreter frames' place in the record.
const _: () = assert!(GO_LABELS * GO_LABEL_LEN <= INTERP_FRAMES * INTERP_FRAME_LEN);

/// One pprof label of a Go sample, as the BPF program read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoLabel<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The key, the value was longer than the BPF program keeps.
    pub key_cut: bool,
    pub value_cut: bool,
}
/// One interpreter frame as the BPF program read it (`struct
/// interp_frame`); what its fields mean depends on the interpreter and its
/// version (see [`super::runtime::Runtime::frames`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawInterpFrame {
    /// The code object's (PHP: the function's) address in the process.
    pub code: u64,
    /// The 8 bytes at the version's instruction field: CPython's `f_lasti`
    /// (an int) in 3.8 to 3.10, the instruction pointer from 3.11 on; PHP's
    /// opline.
    pub instr: u64,
    /// The byte at the version's end field: CPython's `is_entry` (3.11) or
    /// `owner` (3.12 on); PHP's call info, bits 16 to 23.
    pub end: u8,
}

/// One sample, borrowing the record.
#[derive(Debug)]
pub struct Sample<'a> {
    pub tgid: u32,
    pub tid: u32,
    /// The process's start time (ns since boot): with `tgid`, tells a reused
    /// pid from the process that had it before.
    pub start_time: u64,
    pub comm: &'a [u8],
    pub exe: &'a [u8],
    /// Kernel frames, leaf first (empty when the kernel stack was unreadable).
    pub kernel: Vec<u64>,
    /// User frames walked by frame pointers, leaf first.
    pub user_fp: Vec<u64>,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The user stack from `sp` upwards.
    pub stack: &'a [u8],
    pub flags: u32,
    /// With [`FLAG_OFF_CPU`]: how long the thread waited, in nanoseconds.
    pub off_cpu_ns: u64,
    /// The thread's interpreter frames, innermost first (empty for a
    /// process that runs no interpreter whose frames are walked).
    pub interp: Vec<RawInterpFrame>,
    /// With [`FLAG_GO_LABELS`]: the pprof labels of the goroutine the thread
    /// ran.
    pub go_labels: Vec<GoLabel<'a>>,
}

/// Why a record was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    Short(usize),
    StackLength { claimed: u32, present: usize },
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Short(n) => write!(f, "record of {n} bytes, shorter than {HEADER_LEN}"),
            ParseError::StackLength { claimed, present } => write!(
                f,
                "record claims {claimed} bytes of stack but carries {present}"
            ),
        }
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn i32_at(b: &[u8], off: usize) -> i32 {
    i32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// The frames of a `bpf_get_stack` result: `bytes` filled (negative: error).
fn frames(b: &[u8], off: usize, bytes: i32) -> Vec<u64> {
    let n = usize::try_from(bytes).unwrap_or(0).min(MAX_FRAMES * 8) / 8;
    (0..n)
        .map(|i| u64_at(b, off + i * 8))
        .take_while(|&a| a != 0)
        .collect()
}

/// Bytes up to the first NUL.
fn c_str(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..end]
}

impl<'a> Sample<'a> {
    pub fn parse(b: &'a [u8]) -> Result<Sample<'a>, ParseError> {
        if b.len() < HEADER_LEN {
            return Err(ParseError::Short(b.len()));
        }
        let stack_len = u32_at(b, OFF_STACK_LEN);
        let present = b.len() - HEADER_LEN;
        let n = stack_len as usize;
        if n > present || n > STACK_COPY {
            return Err(ParseError::StackLength {
                claimed: stack_len,
                present,
            });
        }
        let flags = u32_at(b, OFF_FLAGS);
        let filled = u32_at(b, OFF_INTERP_FRAMES) as usize;
        Ok(Sample {
            tgid: u32_at(b, OFF_TGID),
            tid: u32_at(b, OFF_TID),
            start_time: u64_at(b, OFF_START),
            comm: c_str(&b[OFF_COMM..OFF_COMM + COMM_LEN]),
            exe: c_str(&b[OFF_EXE..OFF_EXE + EXE_LEN]),
            kernel: frames(b, OFF_KERNEL, i32_at(b, OFF_KBYTES)),
            user_fp: frames(b, OFF_USER, i32_at(b, OFF_UBYTES)),
            ip: u64_at(b, OFF_IP),
            sp: u64_at(b, OFF_SP),
            bp: u64_at(b, OFF_BP),
            stack: &b[HEADER_LEN..HEADER_LEN + n],
            flags,
            off_cpu_ns: u64_at(b, OFF_OFF_CPU),
            interp: if flags & FLAG_GO_LABELS != 0 {
                Vec::new()
            } else {
                (0..filled.min(INTERP_FRAMES))
                    .map(|i| {
                        let at = OFF_INTERP + i * INTERP_FRAME_LEN;
                        RawInterpFrame {
                            code: u64_at(b, at),
                            instr: u64_at(b, at + 8),
                            end: b[at + 16],
                        }
                    })
                    .collect()
            },
            go_labels: if flags & FLAG_GO_LABELS != 0 {
                (0..filled.min(GO_LABELS))
                    .map(|i| {
                        let at = OFF_INTERP + i * GO_LABEL_LEN;
                        let (k, v) = (u32_at(b, at) as usize, u32_at(b, at + 4) as usize);
                        let key = at + 8;
                        let value = key + GO_KEY_LEN;
                        GoLabel {
                            key: &b[key..key + k.min(GO_KEY_LEN)],
                            value: &b[value..value + v.min(GO_VALUE_LEN)],
                            key_cut: k > GO_KEY_LEN,
                            value_cut: v > GO_VALUE_LEN,
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            },
        })
    }

    /// The 8-byte word of the copied stack at `addr`, if it was copied.
    pub fn stack_word(&self, addr: u64) -> Option<u64> {
        let off = usize::try_from(addr.checked_sub(self.sp)?).ok()?;
        let bytes = self.stack.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record as the BPF program writes it.
    pub(crate) fn record(
        tgid: u32,
        comm: &str,
        kernel: &[u64],
        user: &[u64],
        regs: (u64, u64, u64),
        stack: &[u8],
    ) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[OFF_TGID..OFF_TGID + 4].copy_from_slice(&tgid.to_le_bytes());
        b[OFF_TID..OFF_TID + 4].copy_from_slice(&tgid.to_le_bytes());
        b[OFF_START..OFF_START + 8].copy_from_slice(&7u64.to_le_bytes());
        b[OFF_COMM..OFF_COMM + comm.len()].copy_from_slice(comm.as_bytes());
        b[OFF_KBYTES..OFF_KBYTES + 4].copy_from_slice(&((kernel.len() * 8) as i32).to_le_bytes());
        b[OFF_UBYTES..OFF_UBYTES + 4].copy_from_slice(&((user.len() * 8) as i32).to_le_bytes());
        b[OFF_IP..OFF_IP + 8].copy_from_slice(&regs.0.to_le_bytes());
        b[OFF_SP..OFF_SP + 8].copy_from_slice(&regs.1.to_le_bytes());
        b[OFF_BP..OFF_BP + 8].copy_from_slice(&regs.2.to_le_bytes());
        b[OFF_STACK_LEN..OFF_STACK_LEN + 4].copy_from_slice(&(stack.len() as u32).to_le_bytes());
        for (i, a) in kernel.iter().enumerate() {
            b[OFF_KERNEL + i * 8..OFF_KERNEL + i * 8 + 8].copy_from_slice(&a.to_le_bytes());
        }
        for (i, a) in user.iter().enumerate() {
            b[OFF_USER + i * 8..OFF_USER + i * 8 + 8].copy_from_slice(&a.to_le_bytes());
        }
        b.extend_from_slice(stack);
        b
    }

    /// `b`, a record, with these Python frames (innermost first).
    pub(crate) fn with_python(mut b: Vec<u8>, frames: &[RawInterpFrame]) -> Vec<u8> {
        b[OFF_INTERP_FRAMES..OFF_INTERP_FRAMES + 4]
            .copy_from_slice(&(frames.len() as u32).to_le_bytes());
        for (i, f) in frames.iter().enumerate() {
            let at = OFF_INTERP + i * INTERP_FRAME_LEN;
            b[at..at + 8].copy_from_slice(&f.code.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&f.instr.to_le_bytes());
            b[at + 16] = f.end;
        }
        b
    }

    /// `b`, a record, with these pprof labels (lengths as in the process).
    pub(crate) fn with_go_labels(mut b: Vec<u8>, labels: &[(&str, &str)]) -> Vec<u8> {
        let flags = u32_at(&b, OFF_FLAGS) | FLAG_GO_LABELS;
        b[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
        b[OFF_INTERP_FRAMES..OFF_INTERP_FRAMES + 4]
            .copy_from_slice(&(labels.len() as u32).to_le_bytes());
        for (i, (k, v)) in labels.iter().enumerate() {
            let at = OFF_INTERP + i * GO_LABEL_LEN;
            b[at..at + 4].copy_from_slice(&(k.len() as u32).to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&(v.len() as u32).to_le_bytes());
            let (k, v) = (k.as_bytes(), v.as_bytes());
            let (kn, vn) = (k.len().min(GO_KEY_LEN), v.len().min(GO_VALUE_LEN));
            b[at + 8..at + 8 + kn].copy_from_slice(&k[..kn]);
            b[at + 8 + GO_KEY_LEN..at + 8 + GO_KEY_LEN + vn].copy_from_slice(&v[..vn]);
        }
        b
    }

    #[test]
    fn go_labels_read_back_cut_to_their_fields() {
        let long = "v".repeat(200);
        let b = with_go_labels(
            record(1, "go", &[], &[], (0, 0, 0), &[]),
            &[("span_id", "00000000000000aa"), ("route", &long)],
        );
        let s = Sample::parse(&b).unwrap();
        assert!(s.interp.is_empty(), "no interpreter frames beside labels");
        assert_eq!(s.go_labels.len(), 2);
        let l = s.go_labels[0];
        assert_eq!(
            (l.key, l.value, l.key_cut, l.value_cut),
            (&b"span_id"[..], &b"00000000000000aa"[..], false, false)
        );
        assert_eq!(s.go_labels[1].value.len(), GO_VALUE_LEN);
        assert!(s.go_labels[1].value_cut && !s.go_labels[1].key_cut);
        // A count over the bound reads the bound.
        let mut b = b;
        b[OFF_INTERP_FRAMES..OFF_INTERP_FRAMES + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(Sample::parse(&b).unwrap().go_labels.len(), GO_LABELS);
    }

    /// `b`, a record, made a wait of `ns` nanoseconds.
    pub(crate) fn off_cpu(mut b: Vec<u8>, ns: u64) -> Vec<u8> {
        b[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&FLAG_OFF_CPU.to_le_bytes());
        b[OFF_OFF_CPU..OFF_OFF_CPU + 8].copy_from_slice(&ns.to_le_bytes());
        b
    }

    #[test]
    fn a_record_reads_back() {
        let stack: Vec<u8> = (0..64u8).collect();
        let b = record(
            42,
            "hot",
            &[0xffff_ffff_8100_0000],
            &[0x401000, 0x401100],
            (0x401000, 0x7ff0_0000, 0),
            &stack,
        );
        let s = Sample::parse(&b).unwrap();
        assert_eq!((s.tgid, s.start_time, s.comm), (42, 7, &b"hot"[..]));
        assert_eq!(s.kernel, [0xffff_ffff_8100_0000]);
        assert_eq!(s.user_fp, [0x401000, 0x401100]);
        assert_eq!(s.stack.len(), 64);
        assert_eq!(
            s.stack_word(0x7ff0_0008),
            Some(u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]))
        );
        assert_eq!(s.stack_word(0x7ff0_0040), None, "past the copy");
        assert_eq!(s.stack_word(0x7fef_fff8), None, "below sp");
        assert!(s.interp.is_empty());
        let frames = [
            RawInterpFrame {
                code: 0x7f00_0000_1000,
                instr: 0x7f00_0000_10c4,
                end: 0,
            },
            RawInterpFrame {
                code: 0x7f00_0000_2000,
                instr: 9,
                end: 3,
            },
        ];
        let b = with_python(b, &frames);
        assert_eq!(Sample::parse(&b).unwrap().interp, frames);
    }

    #[test]
    fn inconsistent_records_are_refused() {
        assert_eq!(
            Sample::parse(&[0; 100]).unwrap_err(),
            ParseError::Short(100)
        );
        let mut b = record(1, "x", &[], &[], (0, 0, 0), &[0; 8]);
        b[OFF_STACK_LEN..OFF_STACK_LEN + 4].copy_from_slice(&9u32.to_le_bytes());
        assert!(matches!(
            Sample::parse(&b),
            Err(ParseError::StackLength {
                claimed: 9,
                present: 8
            })
        ));
        // A negative stack result (an error) is no frames, not a huge count.
        let mut b = record(1, "x", &[], &[], (0, 0, 0), &[]);
        b[OFF_KBYTES..OFF_KBYTES + 4].copy_from_slice(&(-14i32).to_le_bytes());
        assert!(Sample::parse(&b).unwrap().kernel.is_empty());
    }
}
