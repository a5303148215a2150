//! Debug files as proflow reads them: a file fetched from debuginfod is
//! parsed in memory (`ElfInfo::parse`, `symbolize`'s check of its build id)
//! and then read from the cache as a file, like any ELF file a process maps
//! (`ElfInfo::read`, the `ebpf` receiver and `symbolize` sources); addresses
//! are then named from its ELF symbols and DWARF (`Symbols::file`, blazesym).
//! Whatever the bytes: no panic, no hang, no allocation past the limits,
//! and the file read from disk says what the same bytes in memory say.
#![no_main]
use std::cell::RefCell;
use std::io::Write as _;
use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use proflow_symbolize::elf::ElfInfo;
use proflow_symbolize::{Addr, FileKey, FileRef, Limits, Symbols};

/// One symbolizer for the process (making one sweeps the temporary
/// directory), each input under a key of its own so nothing is answered
/// from an earlier input's cache; and the one file the inputs are written to.
struct State {
    symbols: Symbols,
    path: PathBuf,
    inputs: u64,
}

impl State {
    fn new() -> State {
        let limits = Limits {
            max_entries: 1024,
            max_open: 1,
            // The symbolize processor's default `max_debug_info`.
            max_debug_info: 16 << 20,
        };
        State {
            symbols: Symbols::new(limits, Some(Vec::new())),
            path: std::env::temp_dir()
                .join(format!("proflow-fuzz-debug-file-{}", std::process::id())),
            inputs: 0,
        }
    }
}

thread_local! {
    // blazesym's symbolizer is not Send: one per thread (libFuzzer runs one).
    static STATE: RefCell<State> = RefCell::new(State::new());
}

fuzz_target!(|data: &[u8]| STATE.with_borrow_mut(|state| one(state, data)));

fn one(state: &mut State, data: &[u8]) {
    let in_memory = ElfInfo::parse(data);
    {
        let mut file = std::fs::File::create(&state.path).expect("the temporary file");
        file.write_all(data).expect("write the temporary file");
    }
    let from_file = ElfInfo::read(&state.path);
    match (&in_memory, &from_file) {
        (Some(m), Some(f)) => {
            assert_eq!(
                m.build_id, f.build_id,
                "build id in memory and from the file"
            );
            assert_eq!(m.loads, f.loads, "segments in memory and from the file");
            assert_eq!(m.links, f.links, "links in memory and from the file");
            assert_eq!(
                m.debug_size, f.debug_size,
                "DWARF size in memory and from the file"
            );
        }
        (None, None) => {}
        _ => panic!(
            "ELF in memory: {}, from the file: {}",
            in_memory.is_some(),
            from_file.is_some()
        ),
    }
    let Some(info) = in_memory else {
        return;
    };
    state.inputs += 1;
    let key = FileKey::Path(format!("input-{}", state.inputs).into());
    let file = FileRef {
        key: &key,
        path: &state.path,
        id: from_file.as_ref().and_then(|f| f.file),
        held: None,
    };
    // Addresses: each loadable segment's start and a little past it, and a
    // few the input's first bytes choose.
    let mut addrs: Vec<Addr> = Vec::new();
    for load in info.loads.iter().take(4) {
        addrs.push(Addr::Virtual(load.vaddr));
        addrs.push(Addr::Virtual(load.vaddr.wrapping_add(0x10)));
        addrs.push(Addr::FileOffset(load.offset.wrapping_add(0x10)));
    }
    for chunk in data.chunks_exact(8).take(4) {
        let a = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        addrs.push(Addr::Virtual(a));
        addrs.push(Addr::FileOffset(a));
    }
    for addr in addrs {
        state.symbols.file(file, addr);
    }
}
