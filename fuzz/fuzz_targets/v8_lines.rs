//! V8's source position tables and scripts' sources (read from a profiled
//! Node's memory, so untrusted) as the ebpf receiver decodes them: the
//! first 8 bytes are a code offset to look up, the next 2 how many of the
//! rest are the table, the rest a source as UTF-16 code units. Whatever
//! the bytes, decoding ends without a panic (overflow checks on), a table
//! gives at most one entry per two bytes, a position found is one the
//! table holds, line ends ascend, and a line is between 1 and their count.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::v8lines::{LineEnds, entries, line_of, position_at, script_offset};

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let code_offset = i64::from_le_bytes(data[..8].try_into().unwrap());
    let split = usize::from(u16::from_le_bytes([data[8], data[9]])).min(data.len() - 10);
    let (table, source) = data[10..].split_at(split);
    let all: Vec<(i64, u64)> = entries(table).collect();
    assert!(
        all.len() <= table.len() / 2,
        "{} entries from {} bytes",
        all.len(),
        table.len()
    );
    if let Some(p) = position_at(table, code_offset) {
        assert!(all.iter().any(|&(_, q)| q == p));
        let _ = script_offset(p);
    }
    let mut ends = LineEnds::new(1 << 12);
    ends.push(
        source
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]])),
    );
    let ends = ends.finish();
    assert!(ends.windows(2).all(|w| w[0] < w[1]), "{ends:?}");
    for &offset in ends.iter().take(16) {
        let line = line_of(&ends, offset);
        assert!((1..=ends.len() as u32).contains(&line));
    }
    let line = line_of(&ends, code_offset as u32);
    assert!(line >= 1 && line as usize <= ends.len().max(1));
});
