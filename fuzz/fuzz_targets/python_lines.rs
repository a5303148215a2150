//! CPython line tables (read from a profiled process's memory, so
//! untrusted) as the ebpf receiver decodes them: lnotab (3.8, 3.9),
//! linetable (3.10) and the location table (3.11 on). The first byte picks
//! the format, the next four the first line, the next four the
//! instruction; the rest is the table. Whatever the bytes, decoding ends
//! without a panic, and the 3.8 to 3.10 tables, whose line changes by at
//! most 128 a pair, stay within that of the first line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::pylines::{linetable_line, lnotab_line, locations_line};

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let first = u32::from_le_bytes(data[1..5].try_into().unwrap());
    let at = i32::from_le_bytes(data[5..9].try_into().unwrap());
    let table = &data[9..];
    let bound = |line: u32| {
        let most = (table.len() / 2) as i64 * 128;
        assert!(
            (i64::from(line) - i64::from(first)).abs() <= most,
            "{line} from {first}"
        );
    };
    match data[0] % 3 {
        0 => {
            if let Some(line) = lnotab_line(table, first, at) {
                bound(line);
            }
        }
        1 => {
            if let Some(line) = linetable_line(table, first, at) {
                bound(line);
            }
        }
        _ => {
            let _ = locations_line(table, first, i64::from(at));
        }
    }
});
