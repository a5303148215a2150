//! Addresses → function, file and line inside the receiver (`symbolize:
//! local`), through the symbolizer the `symbolize` processor uses too
//! ([`proflow_symbolize`], where the caches and their bounds are
//! described). This adds what is the receiver's own: a user frame is looked
//! up by its file offset in the file its process maps, read through the
//! descriptor held since the process's mappings were read (see
//! [`super::procs`]), so a process that exited before its samples were read
//! is still named; a file not held is opened through its process's root
//! (`/proc/PID/root/...`, so files inside containers are found) while that
//! process lives.

use proflow_symbolize::{Addr, FileKey, FileRef};
pub use proflow_symbolize::{Limits, Line, Lines, Symbols};

use super::procs::Mapping;

/// A user address in `mapping` (`lookup` already adjusted for return
/// addresses).
pub fn user(symbols: &mut Symbols, mapping: &Mapping, lookup: u64) -> Lines {
    // Without a build id, the path it is opened at (through the process's
    // root): two containers' /usr/bin/app are different files.
    let key = match &mapping.binary.build_id {
        Some(id) => FileKey::BuildId(id.clone()),
        None => FileKey::Path(mapping.open_path.to_string_lossy().into()),
    };
    let file = FileRef {
        key: &key,
        path: &mapping.open_path,
        id: mapping.binary.id,
        held: mapping.binary.held_path(),
    };
    symbols.file(file, Addr::FileOffset(mapping.file_offset(lookup)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn a_function_of_this_binary_is_found_through_its_mapping() {
        // Map this test binary as a process would, from its own maps.
        let addr = a_function_to_find as *const () as u64;
        let _ = a_function_to_find();
        let me = std::env::current_exe().unwrap();
        let line = super::super::procs::own_maps_line(addr);
        let f: Vec<&str> = line.split_whitespace().collect();
        let (s, e) = f[0].split_once('-').unwrap();
        let mapping = Mapping {
            start: u64::from_str_radix(s, 16).unwrap(),
            end: u64::from_str_radix(e, 16).unwrap(),
            offset: u64::from_str_radix(f[2], 16).unwrap(),
            binary: Arc::new(super::super::procs::tests_binary(&me)),
            open_path: me.as_path().into(),
        };
        let mut symbols = Symbols::new(
            Limits {
                max_entries: 10,
                max_open: 2,
                max_debug_info: u64::MAX,
            },
            None,
        );
        let lines = user(&mut symbols, &mapping, addr);
        let last = lines.last().expect("symbolized");
        assert!(last.function.contains("a_function_to_find"), "{lines:?}");
        assert!(
            last.file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs")),
            "{lines:?}"
        );
        assert_eq!(user(&mut symbols, &mapping, addr), lines);
        assert_eq!(symbols.len(), 1);
    }
}
