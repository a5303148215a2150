//! A sample's user stack ([`user_stack`]): framehop over the stack the BPF
//! program copied, with each module's unwind sections (frame pointers where
//! a module has none); CPython's perf trampolines stepped over by their
//! layout; a JVM's Java frames stepped by HotSpot's ([`super::jvm`]); the
//! kernel's frame-pointer walk where that goes further. How each stack was
//! found is counted ([`Unwound`]).

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};

use super::frame::Frame;
use super::interp::InterpFrame;
use super::jvm;
use super::procs::Process;
use super::runtime::Runtime;
use super::sample::{FLAG_KTHREAD, Sample};

/// Frames kept per user stack at most.
const MAX_USER_FRAMES: usize = 256;

/// How a sample's user stack was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwound {
    /// framehop reached the outermost frame.
    Complete,
    /// framehop stopped early and the kernel's frame-pointer walk, longer,
    /// was taken.
    FramePointers,
    /// framehop stopped early and was still the longer of the two (or
    /// found a JVM's or Node's frames, which the kernel's walk cannot
    /// name).
    Truncated,
    /// No user part (a kernel thread), or no registers to start from.
    None,
}

impl Unwound {
    pub const ALL: [Unwound; 4] = [
        Unwound::Complete,
        Unwound::FramePointers,
        Unwound::Truncated,
        Unwound::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Unwound::Complete => "complete",
            Unwound::FramePointers => "frame_pointers",
            Unwound::Truncated => "truncated",
            Unwound::None => "none",
        }
    }
}

/// How the user stack of a sample is found: framehop over the copied stack
/// with each module's `.eh_frame` (and frame pointers where a module has
/// none, and in code no file maps), frame by frame; a return into one of
/// CPython's perf trampolines (`-X perf`, which keep no frame pointer) is
/// stepped over by its known layout. If it ends cleanly (at the outermost
/// frame), that is the stack.
/// If it stops early (the stack copy ran out, or no rule applied), the
/// kernel's frame-pointer walk is taken instead when it has more frames:
/// code with frame pointers and a stack deeper than the copy; not where
/// it found a runtime's frames, which that walk would leave unnamed.
/// In a JVM, a frame in its code cache is stepped by HotSpot's layout
/// ([`super::jvm::step`]); in Node, a frame in V8's code is named by its
/// function ([`super::v8`]). The frames found are returned beside the
/// stack, by their index in it.
pub fn user_stack(
    process: &mut Process,
    cache: &mut CacheX86_64,
    s: &Sample<'_>,
) -> (Vec<Frame>, Unwound, Vec<(usize, InterpFrame)>) {
    let mut java = Vec::new();
    if s.flags & FLAG_KTHREAD != 0 {
        return (Vec::new(), Unwound::None, java);
    }
    let fp: Vec<Frame> = s
        .user_fp
        .iter()
        .enumerate()
        .map(|(i, &addr)| Frame {
            addr,
            is_return: i > 0,
        })
        .collect();
    if s.ip == 0 || s.sp == 0 {
        return (fp, Unwound::None, java);
    }
    let mut out_of_copy = false;
    let mut read = |addr: u64| match s.stack_word(addr) {
        Some(w) => Ok(w),
        None => {
            out_of_copy = true;
            Err(())
        }
    };
    let mut frames = vec![Frame {
        addr: s.ip,
        is_return: false,
    }];
    let mut clean = false;
    let mut regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
    let mut address = FrameAddress::from_instruction_pointer(s.ip);
    // The Java registers while in a JVM's code cache.
    let mut in_java: Option<jvm::Regs> = None;
    while frames.len() < MAX_USER_FRAMES {
        let at = address.address();
        let i = frames.len() - 1;
        let js = js_functions(
            process,
            at,
            address.is_return_address(),
            regs.bp(),
            &mut read,
        );
        java.extend(js.into_iter().map(|f| (i, f)));
        if let Some(blob) = java_blob(process, at) {
            let r = in_java.unwrap_or(jvm::Regs {
                pc: at,
                sp: regs.sp(),
                fp: regs.bp(),
                unextended_sp: regs.sp(),
            });
            let Some((frame, caller)) = jvm::step(blob, r, |a| read(a).ok()) else {
                break;
            };
            if let Some(Runtime::Jvm(j)) = process.runtime.as_mut() {
                let i = frames.len() - 1;
                let frames = j.java_frames(frame, at, address.is_return_address());
                java.extend(frames.into_iter().map(|f| (i, f)));
            }
            // The frame is named even where its caller is past the copy.
            let Some(caller) = caller else {
                break;
            };
            regs.set_sp(caller.sp);
            regs.set_bp(caller.fp);
            in_java = Some(caller);
            let Some(a) = FrameAddress::from_return_address(caller.pc) else {
                break;
            };
            address = a;
            frames.push(Frame {
                addr: caller.pc,
                is_return: true,
            });
            continue;
        }
        in_java = None;
        match native_step(process, address, &mut regs, cache, &mut read) {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(a) => {
                    address = a;
                    frames.push(Frame {
                        addr: ra,
                        is_return: true,
                    });
                }
                None => break,
            },
            Ok(None) => {
                clean = true;
                break;
            }
            Err(()) => break,
        }
    }
    if clean && !out_of_copy {
        (frames, Unwound::Complete, java)
    } else if frames.len() >= fp.len() || !java.is_empty() {
        (frames, Unwound::Truncated, java)
    } else {
        (fp, Unwound::FramePointers, Vec::new())
    }
}

/// The return address of the native frame at `address` (`None`: the
/// stack's end), its caller's registers set in `regs`: CPython's
/// trampolines by their layout, any other frame by its unwind rules.
fn native_step(
    process: &mut Process,
    address: FrameAddress,
    regs: &mut UnwindRegsX86_64,
    cache: &mut CacheX86_64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, ()> {
    let at = address.address();
    if address.is_return_address()
        && process.mapping(at).is_none()
        && process.is_cpython_trampoline_return(at)
    {
        // `sub $8, %rsp; call *%rcx`: its caller's return address is
        // one word above the stack pointer, its frame two words.
        let sp = regs.sp();
        read(sp.wrapping_add(8)).map(|ra| {
            regs.set_sp(sp.wrapping_add(16));
            Some(ra)
        })
    } else {
        process
            .unwinder
            .unwind_frame(address, regs, cache, read)
            .map_err(|_| ())
    }
}

/// The JavaScript functions of the frame at `at` (a return address when
/// `is_return`) whose frame pointer is `fp`, innermost first, when the
/// process runs V8 and `at` is in its code (code no file maps, or the
/// builtins in its binary).
fn js_functions(
    process: &mut Process,
    at: u64,
    is_return: bool,
    fp: u64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Vec<InterpFrame> {
    let anonymous = process.mapping(at).is_none();
    match process.runtime.as_mut() {
        Some(Runtime::V8(v)) if anonymous || v.in_builtins(at) => {
            v.functions_at(fp, at, is_return, |a| read(a).ok())
        }
        _ => Vec::new(),
    }
}

/// The blob of a JVM's code cache holding `at`, an address no file maps,
/// when the process runs one.
fn java_blob(process: &mut Process, at: u64) -> Option<jvm::Blob> {
    if process.mapping(at).is_some() {
        return None;
    }
    match process.runtime.as_mut()? {
        Runtime::Jvm(j) => j.blob(at),
        _ => None,
    }
}
