//! HotSpot's line number tables and variable-length integers (read from a
//! profiled JVM's memory, so untrusted) as the ebpf receiver decodes them:
//! the input's first byte picks the integer encoding (JDK 17's, or the one
//! without the zero byte of later versions), the rest is a method's
//! compressed line table. Whatever the bytes, decoding ends without a
//! panic (overflow checks on), gives at most one entry a byte read, and
//! the line found for a bytecode the table names is one of its lines.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::jvmlines::{decode_lines, line_at, unsigned5};

fuzz_target!(|data: &[u8]| {
    let Some((&first, table)) = data.split_first() else {
        return;
    };
    let excludes_zero = first & 1 == 1;
    let lines = decode_lines(table, excludes_zero);
    assert!(
        lines.len() <= table.len(),
        "{} entries from {} bytes",
        lines.len(),
        table.len()
    );
    if let Some(&(bci, _)) = lines.first() {
        let line = line_at(&lines, bci);
        assert!(lines.iter().any(|&(_, l)| l == line));
    }
    // The integers alone: each read moves on by one to five bytes.
    let mut pos = 0;
    while pos < table.len() {
        let before = pos;
        if unsigned5(table, &mut pos, excludes_zero).is_none() {
            break;
        }
        assert!((1..=5).contains(&(pos - before)));
    }
});
