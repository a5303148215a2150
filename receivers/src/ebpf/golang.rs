//! Go processes: the pprof labels of the goroutine each sample ran
//! (`runtime/pprof.Do`, `pprof.SetGoroutineLabels`), with no profiling
//! client, so that a service whose spans set `span_id` (as the Go OTel
//! profiling bridges do) gets it on every sample.
//!
//! A file is a Go program when it has a `.go.buildinfo` section; its Go
//! version (in that section since Go 1.18) says where the runtime keeps the
//! labels: the BPF program reads the thread's g from its TLS slot, then
//! `g.m.curg.labels`, a `*labelMap` whose first field is a slice of
//! `{key, value string}` sorted by key (Go 1.24 on; before, a map, which is
//! not read). The offsets below were read from each version's own DWARF
//! (`runtime.g`, `runtime.m`; linux/amd64 builds of go1.24.0, go1.25.0 and
//! go1.26.8); a newer version's samples carry no labels until its row is
//! added. A stripped program linked by the system linker (cgo) has a TLS
//! block but no `runtime.tlsg` to say where g is in it: not read.

use object::{Object, ObjectSection, ObjectSymbol};

/// Offsets of one Go version's runtime structs (amd64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offsets {
    minor: u32,
    g_m: u32,
    m_curg: u32,
    g_labels: u32,
}

static OFFSETS: [Offsets; 3] = [
    Offsets {
        minor: 24,
        g_m: 48,
        m_curg: 192,
        g_labels: 352,
    },
    Offsets {
        minor: 25,
        g_m: 48,
        m_curg: 184,
        g_labels: 344,
    },
    Offsets {
        minor: 26,
        g_m: 48,
        m_curg: 184,
        g_labels: 352,
    },
];

/// What a Go program's file gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoBinary {
    /// `go1.26.8`.
    pub version: String,
    offsets: Offsets,
    /// The g's TLS slot from the fs base.
    tls_g: i64,
}

/// `struct go_proc` of the BPF program: one Go process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct GoProcValue {
    pub start_time: u64,
    tls_g: i64,
    g_m: u32,
    m_curg: u32,
    g_labels: u32,
    pad: u32,
}

// SAFETY: plain integers, `repr(C)`, no implicit padding (8 + 8 + 4 × 4
// bytes).
unsafe impl aya::Pod for GoProcValue {}

impl GoBinary {
    /// What the BPF program needs to read a process's labels.
    pub fn bpf_value(&self, start_time: u64) -> GoProcValue {
        GoProcValue {
            start_time,
            tls_g: self.tls_g,
            g_m: self.offsets.g_m,
            m_curg: self.offsets.m_curg,
            g_labels: self.offsets.g_labels,
            pad: 0,
        }
    }
}

/// The Go version in a `.go.buildinfo` section (Go 1.18 on: the version
/// string right after the 32-byte header, its length a uvarint).
pub fn version_of(buildinfo: &[u8]) -> Option<&str> {
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    const VERSION_INLINE: u8 = 0x2;
    if buildinfo.get(..MAGIC.len())? != MAGIC || buildinfo.get(15)? & VERSION_INLINE == 0 {
        return None;
    }
    let mut len = 0usize;
    let mut at = 32;
    for shift in (0..35).step_by(7) {
        let b = *buildinfo.get(at)?;
        at += 1;
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
    }
    std::str::from_utf8(buildinfo.get(at..at.checked_add(len)?)?).ok()
}

/// The minor version of `go1.X` or `go1.X.Y` (or with a suffix).
fn minor_of(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("go1.")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Reads a Go program's version and the g's TLS slot; `None` for a file
/// that is no Go program, or one of a Go version whose labels are not read.
pub fn read<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<GoBinary> {
    let info = elf.section_by_name(".go.buildinfo")?;
    let data = info.data().ok()?;
    let version = version_of(data.get(..data.len().min(4096))?)?.to_owned();
    let minor = minor_of(&version)?;
    let offsets = *OFFSETS.iter().find(|o| o.minor == minor)?;
    Some(GoBinary {
        version,
        offsets,
        tls_g: tls_g(elf)?,
    })
}

/// The g's TLS slot from the fs base: `runtime.tlsg`'s offset in the
/// executable's TLS block (an externally linked program's, cgo's), which
/// ends at the fs base (x86_64's TLS variant II: the block starts its size,
/// rounded up to its alignment, below it); -8, the internal linker's fixed
/// slot, for a program without a TLS block. `None` for one with a TLS
/// block but no `runtime.tlsg` (a stripped cgo program: its slot is not
/// known).
fn tls_g<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<i64> {
    let tls: Vec<_> = elf
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n == ".tdata" || n == ".tbss"))
        .collect();
    if tls.is_empty() {
        return Some(-8);
    }
    let tlsg = elf
        .symbols()
        .find(|s| s.name().is_ok_and(|n| n == "runtime.tlsg"))?;
    let start = tls.iter().map(|s| s.address()).min()?;
    let end = tls
        .iter()
        .map(|s| s.address().checked_add(s.size()))
        .max()??;
    let align = tls.iter().map(|s| s.align().max(1)).max()?;
    let size = end.checked_sub(start)?.div_ceil(align).checked_mul(align)?;
    // A TLS symbol's value is its offset in the block.
    i64::try_from(tlsg.address())
        .ok()?
        .checked_sub(i64::try_from(size).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buildinfo(version: &str) -> Vec<u8> {
        let mut b = b"\xff Go buildinf:".to_vec();
        b.extend([8, 2]);
        b.resize(32, 0);
        b.push(version.len() as u8);
        b.extend(version.as_bytes());
        b.extend([0xa5, 0x05]);
        b
    }

    #[test]
    fn the_version_from_the_build_info() {
        assert_eq!(version_of(&buildinfo("go1.25.0")), Some("go1.25.0"));
        let mut old = buildinfo("go1.17");
        old[15] = 0;
        assert_eq!(version_of(&old), None, "before 1.18: pointers, not read");
        assert_eq!(version_of(b"\xff Go buildinf:"), None, "short");
        let mut long = buildinfo("go1.25.0");
        long[32] = 0xff;
        assert_eq!(version_of(&long), None, "a length past the section");
        assert_eq!(minor_of("go1.26.8"), Some(26));
        assert_eq!(minor_of("go1.24rc1"), Some(24));
        assert_eq!(minor_of("devel +abc"), None);
    }

    #[test]
    fn a_file_without_go_build_info_is_no_go_program() {
        // The test binary is Rust: no Go build info.
        let me = std::fs::read("/proc/self/exe").unwrap();
        let elf = object::File::parse(&*me).unwrap();
        assert_eq!(read(&elf), None);
    }
}
