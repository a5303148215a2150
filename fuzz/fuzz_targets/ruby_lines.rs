//! Ruby 3.1's line tables (read from a profiled process's memory, so
//! untrusted) as the ebpf receiver decodes them: the input's first 48 bytes
//! are an iseq's line table (where its instructions, entries and succinct
//! index are, and how many) and a pc; the rest is the process's memory,
//! from address 0x1000. Whatever the bytes, decoding ends without a panic,
//! reads only fixed sizes, and a line is found only for a pc inside the
//! iseq, from an entry inside its table.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::rubylines::{LineTable, line_of};

const BASE: u64 = 0x1000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 48 {
        return;
    }
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    let t = LineTable {
        encoded: word(0),
        size: word(1) & 0xffff_ffff,
        info: word(2),
        info_size: word(3) & 0xffff_ffff,
        succ: word(4),
    };
    let pc = word(5);
    let memory = &data[48..];
    let reads = std::cell::Cell::new(0usize);
    let mem = |addr: u64, buf: &mut [u8]| {
        reads.set(reads.get() + 1);
        assert!(buf.len() <= 80, "a read of {} bytes", buf.len());
        let Some(start) = addr.checked_sub(BASE).and_then(|o| usize::try_from(o).ok()) else {
            return false;
        };
        match memory.get(start..start.saturating_add(buf.len())) {
            Some(src) => {
                buf.copy_from_slice(src);
                true
            }
            None => false,
        }
    };
    if line_of(&mem, &t, pc).is_some() {
        assert!(
            pc >= t.encoded && (pc - t.encoded) / 8 <= t.size,
            "a pc outside the iseq"
        );
    }
    assert!(reads.get() <= 2, "{} reads for one line", reads.get());
});
