//! Ruby 3.1's line tables as the ebpf receiver reads them from a profiled
//! process (so untrusted): an iseq's line at a pc, found through the
//! succinct index of the positions where its line-table entries begin, as
//! Ruby's own `calc_pos` and `succ_index_lookup` find it. The memory is
//! read through a function (`process_vm_readv` in the receiver, bytes in
//! the fuzz target), and every read is a fixed size.
//!
//! What may depend on this: the receiver's Ruby reader (`ruby.rs`) and,
//! through feature `perf-map`, its fuzz target.

/// Reads `buf.len()` bytes at an address; false when they cannot be read.
pub trait Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

impl<F: Fn(u64, &mut [u8]) -> bool> Memory for F {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self(addr, buf)
    }
}

/// Where an iseq's instructions and line table are (from its constant
/// body): `iseq_encoded`, `iseq_size` (instructions), `insns_info.body`,
/// `insns_info.size` (entries), `insns_info.succ_index_table`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LineTable {
    pub encoded: u64,
    pub size: u64,
    pub info: u64,
    pub info_size: u64,
    pub succ: u64,
}

/// `struct iseq_insn_info_entry`: its size; `line_no` (an int) first.
const INSN_INFO_SIZE: u64 = 12;
/// The succinct index (`struct succ_index_table`): ranks of the first 54
/// positions, 7 bits each, 9 to a word; then blocks of 512 positions
/// (`struct succ_dict_block`: `rank`, `small_block_ranks`, `bits[8]`; 80
/// bytes).
pub const IMMEDIATE: u64 = 54;
const SUCC_PART: u64 = 48;
const SUCC_BLOCK: u64 = 80;

/// The line of `pc` in the iseq of `t`, as Ruby finds it: the instruction
/// before the pc (it points at the next one), its entry in the line table.
/// `None` when the pc is not one of the iseq's, or memory cannot be read.
pub fn line_of(mem: &impl Memory, t: &LineTable, pc: u64) -> Option<u32> {
    if pc == 0 || pc < t.encoded || t.info_size == 0 {
        return None;
    }
    let mut pos = (pc - t.encoded) / 8;
    if pos > t.size {
        return None;
    }
    pos = pos.saturating_sub(1);
    let index = if t.info_size == 1 {
        0
    } else {
        succ_index_lookup(mem, t.succ, pos, t.size)?.checked_sub(1)?
    };
    if index >= t.info_size {
        return None;
    }
    let mut b = [0u8; 4];
    mem.read(t.info.wrapping_add(index * INSN_INFO_SIZE), &mut b)
        .then(|| u32::try_from(i32::from_le_bytes(b)).ok())
        .flatten()
}

/// How many positions of the index at `table` are at most `x` (Ruby's
/// `succ_index_lookup`); `size` bounds `x`.
pub fn succ_index_lookup(mem: &impl Memory, table: u64, x: u64, size: u64) -> Option<u64> {
    if table == 0 || x > size {
        return None;
    }
    if x < IMMEDIATE {
        let mut w = [0u8; 8];
        mem.read(table.wrapping_add((x / 9) * 8), &mut w)
            .then_some(())?;
        return Some((u64::from_le_bytes(w) >> ((x % 9) * 7)) & 0x7f);
    }
    let block = table.wrapping_add(SUCC_PART + ((x - IMMEDIATE) / 512) * SUCC_BLOCK);
    let bit = (x - IMMEDIATE) % 512;
    let small = bit / 64;
    let mut b = [0u8; SUCC_BLOCK as usize];
    if !mem.read(block, &mut b) {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let rank = u64::from(u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")));
    let small_rank = if small == 0 {
        0
    } else {
        (word(8) >> ((small - 1) * 9)) & 0x1ff
    };
    let bits = word(16 + small as usize * 8);
    let count = u64::from((bits << (63 - bit % 64)).count_ones());
    Some(rank + small_rank + count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A succinct index as Ruby 3.1's `succ_index_table_create` lays it out
    /// for `positions` (sorted) up to `max_pos`, as 8-byte words.
    fn succ_table(positions: &[u64], max_pos: u64) -> Vec<u64> {
        let count = |x: u64| positions.iter().filter(|&&p| p <= x).count() as u64;
        let mut words = vec![0u64; 6];
        for j in 0..6u64 {
            for i in 0..9u64 {
                words[j as usize] |= count(j * 9 + i) << (7 * i);
            }
        }
        let blocks = if max_pos < IMMEDIATE {
            0
        } else {
            (max_pos - IMMEDIATE).div_ceil(512)
        };
        for k in 0..blocks {
            let base = IMMEDIATE + k * 512;
            let before = |x: u64| positions.iter().filter(|&&p| p < x).count() as u64;
            let mut small_ranks = 0u64;
            let mut bits = [0u64; 8];
            for (j, b) in bits.iter_mut().enumerate() {
                let from = base + j as u64 * 64;
                if j > 0 {
                    small_ranks |= (before(from) - before(base)) << (9 * (j - 1));
                }
                for &p in positions.iter().filter(|&&p| p >= from && p < from + 64) {
                    *b |= 1 << (p - from);
                }
            }
            words.push(before(base));
            words.push(small_ranks);
            words.extend(bits);
        }
        words
    }

    /// Memory of `words` at address `at`.
    fn memory(words: &[u64], at: u64) -> impl Fn(u64, &mut [u8]) -> bool + '_ {
        move |addr, buf| {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let Some(start) = addr.checked_sub(at).and_then(|o| usize::try_from(o).ok()) else {
                return false;
            };
            match bytes.get(start..start + buf.len()) {
                Some(src) => {
                    buf.copy_from_slice(src);
                    true
                }
                None => false,
            }
        }
    }

    #[test]
    fn the_succinct_index_counts_the_positions_up_to_each() {
        let positions = [0, 3, 7, 53, 54, 60, 100, 565, 566, 700, 1100];
        let max_pos = 1200;
        let table = succ_table(&positions, max_pos);
        let mem = memory(&table, 0x1000);
        for x in 0..=max_pos {
            let want = positions.iter().filter(|&&p| p <= x).count() as u64;
            assert_eq!(
                succ_index_lookup(&mem, 0x1000, x, max_pos),
                Some(want),
                "at {x}"
            );
        }
        assert_eq!(succ_index_lookup(&mem, 0x1000, max_pos + 1, max_pos), None);
        assert_eq!(succ_index_lookup(&mem, 0, 5, max_pos), None);
        assert_eq!(
            succ_index_lookup(&mem, 0x1000, 1199, 5000),
            Some(positions.len() as u64),
            "past the table's end, within the bound: the last rank"
        );
    }

    #[test]
    fn a_pc_is_at_the_line_of_the_instruction_before_it() {
        // Entries begin at instructions 0 (line 10), 4 (line 11) and 9
        // (line 14); the table's entries are at 0x9000.
        let positions = [0, 4, 9];
        let table = succ_table(&positions, 12);
        // 12-byte entries, `line_no` first: lines at bytes 0, 12 and 24.
        let info: Vec<u64> = vec![10, 11 << 32, 0, 14, 0];
        let tmem = memory(&table, 0x1000);
        let imem = memory(&info, 0x9000);
        let mem = |addr: u64, buf: &mut [u8]| tmem(addr, buf) || imem(addr, buf);
        let t = LineTable {
            encoded: 0x5000,
            size: 12,
            info: 0x9000,
            info_size: 3,
            succ: 0x1000,
        };
        let pc = |i: u64| t.encoded + i * 8;
        assert_eq!(line_of(&mem, &t, pc(1)), Some(10), "instruction 0");
        assert_eq!(line_of(&mem, &t, pc(5)), Some(11), "instruction 4");
        assert_eq!(line_of(&mem, &t, pc(9)), Some(11), "instruction 8");
        assert_eq!(line_of(&mem, &t, pc(10)), Some(14), "instruction 9");
        assert_eq!(line_of(&mem, &t, pc(13)), None, "past the iseq");
        assert_eq!(line_of(&mem, &t, 0x10), None, "before it");
    }
}
