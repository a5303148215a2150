//! The runtime of one process whose state is read at each sample: an
//! interpreter whose frames the BPF program walks ([`super::interp`]), a Go
//! program whose goroutines' pprof labels it reads ([`super::golang`]), or
//! a JVM or a Node whose frames user space walks in the stack it copies
//! ([`super::jvm`], [`super::v8`]).
//! Lives here: which runtime a mapped file is ([`RuntimeBinary`]), the
//! process's ([`Runtime`]), and what its entry in the BPF program's maps is
//! ([`BpfValue`]).

use std::ops::Range;
use std::sync::Arc;

use super::golang::{GoBinary, GoProcValue};
use super::interp::{Code, InterpFrame, InterpProcValue};
use super::jvm::{JvmBinary, JvmProcess};
use super::perl::{PerlBinary, PerlProcess};
use super::php::{PhpBinary, PhpProcess};
use super::python::{PyBinary, PyProcess};
use super::ruby::{RubyBinary, RubyProcess};
use super::sample::RawInterpFrame;
use super::state_budget::StateBudget;
use super::v8::{V8Binary, V8Process};

/// Which runtimes' state is read (the receiver's `python`, `php`, `perl`,
/// `ruby`, `go_labels`, `jvm` and `node` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Runtimes {
    pub python: bool,
    pub php: bool,
    pub perl: bool,
    pub ruby: bool,
    pub go_labels: bool,
    pub jvm: bool,
    pub node: bool,
}

/// What a runtime's file gives (as file addresses), when the file is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeBinary {
    Python(PyBinary),
    Php(PhpBinary),
    Perl(PerlBinary),
    Ruby(RubyBinary),
    Go(GoBinary),
    Jvm(JvmBinary),
    V8(V8Binary),
}

/// What the BPF program is given for one process, and in which map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BpfValue {
    /// `interp_procs`.
    Interp(InterpProcValue),
    /// `go_procs`.
    Go(GoProcValue),
}

impl RuntimeBinary {
    /// Reads a runtime's symbols from a file named like an interpreter of
    /// a known version, or from a Go program of a known version; `None`
    /// for any other file.
    /// `release` is called as the symbol tables are read (see [`super::interp::symbols`]).
    pub fn read<'d, R: object::ReadRef<'d>>(
        elf: &object::File<'d, R>,
        path: &str,
        release: &dyn Fn(),
    ) -> Option<Self> {
        if super::python::version_of(path).is_some() {
            return super::python::read_symbols(elf, path, release).map(RuntimeBinary::Python);
        }
        if super::php::is_php(path) {
            return super::php::read_symbols(elf, release).map(RuntimeBinary::Php);
        }
        if super::perl::is_perl(path) {
            return super::perl::read_symbols(elf, release).map(RuntimeBinary::Perl);
        }
        if super::ruby::is_ruby(path) {
            return super::ruby::read_symbols(elf, release).map(RuntimeBinary::Ruby);
        }
        if super::jvm::is_jvm(path) {
            return super::jvm::read_symbols(elf).map(RuntimeBinary::Jvm);
        }
        if super::v8::is_node(path) {
            return super::v8::read_symbols(elf, release).map(RuntimeBinary::V8);
        }
        super::golang::read(elf).map(RuntimeBinary::Go)
    }
}

/// The runtime of one process, with what was read of its functions.
#[derive(Debug)]
pub enum Runtime {
    Python(PyProcess),
    Php(PhpProcess),
    Perl(PerlProcess),
    Ruby(RubyProcess),
    Go(GoBinary),
    Jvm(Box<JvmProcess>),
    V8(Box<V8Process>),
}

impl Runtime {
    /// The runtime of process `pid` whose file `binary` is mapped moved by
    /// `bias`, when it is read; what is read of it is charged to `budget`.
    pub fn new(
        pid: u32,
        binary: &RuntimeBinary,
        bias: u64,
        on: Runtimes,
        budget: &Arc<StateBudget>,
    ) -> Option<Self> {
        match binary {
            RuntimeBinary::Python(b) if on.python => {
                PyProcess::new(pid, b, bias, budget).map(Runtime::Python)
            }
            RuntimeBinary::Php(b) if on.php => {
                Some(Runtime::Php(PhpProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Perl(b) if on.perl => {
                Some(Runtime::Perl(PerlProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Ruby(b) if on.ruby => {
                Some(Runtime::Ruby(RubyProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Go(b) if on.go_labels => Some(Runtime::Go(b.clone())),
            RuntimeBinary::V8(b) if on.node => {
                Some(Runtime::V8(Box::new(V8Process::new(pid, b, bias, budget))))
            }
            RuntimeBinary::Jvm(b) if on.jvm => Some(Runtime::Jvm(Box::new(JvmProcess::new(
                pid, b, bias, budget,
            )))),
            _ => None,
        }
    }

    /// Where its state is in the process (a new one after an exec or a
    /// reload is another interpreter).
    pub fn runtime(&self) -> u64 {
        match self {
            Runtime::Python(p) => p.runtime,
            Runtime::Php(p) => p.globals,
            Runtime::Perl(p) => p.curinterp,
            Runtime::Ruby(p) => p.vm_ptr,
            Runtime::Go(_) => 0,
            Runtime::Jvm(p) => p.id(),
            Runtime::V8(p) => p.id(),
        }
    }

    /// What the BPF program needs to walk its frames or read its labels
    /// (nothing for a JVM: its frames are walked in user space).
    pub fn bpf_value(&self, start_time: u64) -> Option<BpfValue> {
        Some(match self {
            Runtime::Python(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Php(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Perl(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Ruby(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Go(b) => BpfValue::Go(b.bpf_value(start_time)),
            Runtime::Jvm(_) | Runtime::V8(_) => return None,
        })
    }

    /// Whether the evaluation function's callee is the VM's loop, to leave
    /// out with it (see [`super::interp::merge`]).
    pub fn loop_is_callee(&self) -> bool {
        matches!(self, Runtime::Ruby(_))
    }

    /// Whether `addr` is in the evaluation function.
    pub fn is_eval(&self, addr: u64) -> bool {
        let ranges: &[Range<u64>] = match self {
            Runtime::Python(p) => p.eval(),
            Runtime::Php(p) => std::slice::from_ref(&p.execute_ex),
            Runtime::Perl(p) => std::slice::from_ref(&p.runops),
            Runtime::Ruby(p) => std::slice::from_ref(&p.vm_exec),
            Runtime::Go(_) | Runtime::Jvm(_) | Runtime::V8(_) => &[],
        };
        ranges.iter().any(|r| r.contains(&addr))
    }

    /// The frames of a sample as the interpreter's version lays them out
    /// (innermost first): those each evaluation call ran end at one marked
    /// `last`.
    pub fn frames(&mut self, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
        match self {
            Runtime::Python(p) => super::python::frames(p.layout, raw),
            Runtime::Php(p) => p.frames(raw),
            Runtime::Perl(p) => p.frames(raw),
            Runtime::Ruby(p) => p.frames(raw),
            Runtime::Go(_) | Runtime::Jvm(_) | Runtime::V8(_) => Vec::new(),
        }
    }

    /// The function of `f` and the line the thread is at in it.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        match self {
            Runtime::Python(p) => p.frame(f),
            Runtime::Php(p) => p.frame(f),
            Runtime::Perl(p) => p.frame(f),
            Runtime::Ruby(p) => p.frame(f),
            Runtime::Go(_) => None,
            Runtime::Jvm(p) => p.frame(f),
            Runtime::V8(p) => p.frame(f),
        }
    }

    /// The name of a frame that could not be read.
    pub fn unknown(&self) -> &'static str {
        match self {
            Runtime::Python(_) => "[unknown Python frame]",
            Runtime::Php(_) => "[unknown PHP frame]",
            Runtime::Perl(_) => "[unknown Perl frame]",
            Runtime::Ruby(_) => "[unknown Ruby frame]",
            Runtime::Go(_) => "[unknown frame]",
            Runtime::Jvm(_) => "[unknown Java frame]",
            Runtime::V8(_) => "[unknown JavaScript frame]",
        }
    }
}
