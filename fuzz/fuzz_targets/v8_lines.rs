//! V8's source position tables, inlining positions and scripts' sources
//! (read from a profiled Node's memory, so untrusted) as the ebpf receiver
//! decodes them: the first 8 bytes are a code offset to look up, the next
//! 2 how many of the rest are the table, the next 2 how many after it are
//! inlining entries (12 bytes each: a caller's position, a function's
//! index), the rest a source as UTF-16 code units. Whatever the bytes,
//! decoding ends without a panic (overflow checks on), a table gives at
//! most one entry per two bytes, a position found is one the table holds,
//! an inlined walk gives 1 to 64 frames ending in the outer function, line
//! ends ascend, and a line is between 1 and their count.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::v8lines::{
    Inlining, LineEnds, inlined_frames, line_of, position_in, script_offset, table,
};

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let code_offset = i64::from_le_bytes(data[..8].try_into().unwrap());
    let rest = &data[12..];
    let split = usize::from(u16::from_le_bytes([data[8], data[9]])).min(rest.len());
    let (bytes, rest) = rest.split_at(split);
    let n = usize::from(u16::from_le_bytes([data[10], data[11]])).min(rest.len() / 12);
    let (entries, source) = rest.split_at(n * 12);
    let t = table(bytes);
    assert!(
        t.len() <= bytes.len() / 2,
        "{} entries from {} bytes",
        t.len(),
        bytes.len()
    );
    if let Some(p) = position_in(&t, code_offset) {
        assert!(t.iter().any(|&(_, q)| q == p));
        let _ = script_offset(p);
        let inlining = Inlining {
            inlined: entries
                .chunks_exact(12)
                .map(|e| {
                    let pos = u64::from_le_bytes(e[..8].try_into().unwrap());
                    (pos, u32::from_le_bytes(e[8..].try_into().unwrap()) % 8)
                })
                .collect(),
            functions: (0..8).collect(),
        };
        let frames = inlined_frames(&inlining, p, 100);
        assert!((1..=64).contains(&frames.len()), "{} frames", frames.len());
        assert_eq!(frames.last().map(|f| f.0), Some(100), "{frames:?}");
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
