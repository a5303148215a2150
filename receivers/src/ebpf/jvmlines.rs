//! HotSpot's compressed integers and line number tables, as the `ebpf`
//! receiver's JVM walker ([`super::jvm`]) decodes them from a profiled
//! process's memory (so untrusted: every read is bounded by the bytes
//! given, and a table gives at most one entry a byte).
//!
//! What may depend on this: the JVM walker, and the `jvm_lines` fuzz target
//! (through feature `perf-map`).

/// One of HotSpot's variable-length integers (UNSIGNED5) in `b` at `pos`:
/// bytes below 192 end one, and each byte less `x` is the next 6 bits
/// (`x` is 1 from the versions whose streams exclude the zero byte,
/// told by their 4-byte method flags; 0 before).
pub fn unsigned5(b: &[u8], pos: &mut usize, excludes_zero: bool) -> Option<u32> {
    let x = u8::from(excludes_zero);
    let mut sum = 0u32;
    for i in 0..5 {
        let v = *b.get(*pos)?;
        *pos += 1;
        sum = sum.wrapping_add(u32::from(v.checked_sub(x)?) << (6 * i));
        if v < 192 {
            break;
        }
    }
    Some(sum)
}

/// A compressed line number table: a byte `bci_delta << 3 | line_delta`
/// for small deltas, else 0xFF and both deltas as signed [`unsigned5`]
/// integers (zigzag); 0 ends it.
pub fn decode_lines(table: &[u8], x: bool) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut at = 0;
    let signed = |v: u32| ((v >> 1) as i32) ^ -((v & 1) as i32);
    let (mut bci, mut line) = (0i64, 0i64);
    while out.len() < 1 << 16 {
        let Some(&b) = table.get(at) else { break };
        at += 1;
        match b {
            0 => break,
            0xff => {
                let db = unsigned5(table, &mut at, x);
                let (Some(db), Some(dl)) = (db, unsigned5(table, &mut at, x)) else {
                    break;
                };
                bci += i64::from(signed(db));
                line += i64::from(signed(dl));
            }
            _ => {
                bci += i64::from(b >> 3);
                line += i64::from(b & 7);
            }
        }
        match (u32::try_from(bci), u32::try_from(line)) {
            (Ok(b), Ok(l)) => out.push((b, l)),
            _ => break,
        }
    }
    out
}

/// The line of bytecode `bci`: that of the last entry at or before it.
pub fn line_at(lines: &[(u32, u32)], bci: u32) -> u32 {
    lines
        .iter()
        .filter(|&&(b, _)| b <= bci)
        .max_by_key(|&&(b, _)| b)
        .or(lines.first())
        .map_or(0, |&(_, line)| line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_tables_of_both_encodings_decode() {
        // javac's table of a method at lines 6 to 10 (bci:line 0:6 2:7
        // 12:8 25:7 34:10), as JDK 17 wrote it, and as JDK 25 did (its
        // variable-length integers exclude the zero byte).
        let want = [(0, 6), (2, 7), (12, 8), (25, 7), (34, 10)];
        let jdk17 = [0x06, 0x11, 0x51, 0xff, 0x1a, 0x01, 0x4b, 0x00, 0xa8];
        let jdk25 = [0x06, 0x11, 0x51, 0xff, 0x1b, 0x02, 0x4b, 0x00, 0x38];
        assert_eq!(decode_lines(&jdk17, false), want);
        assert_eq!(decode_lines(&jdk25, true), want);
        // A method at line 14: its first pair escaped.
        assert_eq!(decode_lines(&[0xff, 0x00, 0x1c, 0x00], false), [(0, 14)]);
        assert_eq!(decode_lines(&[0xff, 0x01, 0x1d, 0x00], true), [(0, 14)]);
        // Cut short, or garbage: what was decoded, nothing past it.
        assert_eq!(decode_lines(&jdk17[..4], false), [(0, 6), (2, 7), (12, 8)]);
        assert_eq!(decode_lines(&[0xff, 0x00], true), []);
        assert_eq!(line_at(&want, 30), 7);
        assert_eq!(line_at(&want, 34), 10);
        assert_eq!(line_at(&want, 1), 6);
    }

    #[test]
    fn unsigned5_in_both_encodings() {
        // 300 = 192 + 108: 192 + 108 % 64 = 236, then 108 >> 6 = 1.
        let mut pos = 0;
        assert_eq!(unsigned5(&[236, 1, 7], &mut pos, false), Some(300));
        assert_eq!(unsigned5(&[236, 1, 7], &mut pos, false), Some(7));
        // Without the zero byte: L is 191, so 300 is 191 + 109: 1 + 191 +
        // 45, then 1 + 1.
        let mut pos = 0;
        assert_eq!(unsigned5(&[237, 2, 8], &mut pos, true), Some(300));
        assert_eq!(unsigned5(&[237, 2, 8], &mut pos, true), Some(7));
        // A zero byte where none may be, or the end: none.
        assert_eq!(unsigned5(&[0], &mut 0, true), None);
        assert_eq!(unsigned5(&[236], &mut 0, false), None);
    }

    #[test]
    fn a_long_value_takes_several_bytes() {
        // 1000 = 192 + 808; 808 % 64 = 40 → 232, then 808 >> 6 = 12.
        // Zigzag: a bci delta of 500 is 1000.
        assert_eq!(decode_lines(&[0xff, 232, 12, 2, 0], false), [(500, 1)]);
        assert_eq!(decode_lines(&[0xff, 233, 13, 3, 0], true), [(500, 1)]);
    }
}
