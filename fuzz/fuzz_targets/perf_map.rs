//! Perf maps (`/tmp/perf-PID.map`, written by the profiled process itself,
//! so untrusted) as the ebpf receiver reads them: in two reads, the first
//! byte choosing where the file had grown to at the first. Whatever the
//! bytes, only whole lines are used, every entry is a non-empty range with
//! a name of at most `MAX_NAME` characters and no line break, and each
//! entry's own start finds it (or a later line starting there).
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_receivers::perfmap::fuzzing::{self, MAX_NAME, PerfMap};

fuzz_target!(|data: &[u8]| {
    let Some((&first, file)) = data.split_first() else {
        return;
    };
    let grown = (usize::from(first) * file.len() / 255).min(file.len());
    let mut map = PerfMap::default();
    let used = fuzzing::add_lines(&mut map, &file[..grown]);
    assert!(used <= grown);
    assert!(
        used == 0 || file[used - 1] == b'\n',
        "a read ends after a whole line"
    );
    let more = fuzzing::add_lines(&mut map, &file[used..]);
    assert!(used + more <= file.len());
    for e in fuzzing::entries(&map) {
        assert!(e.start < e.end, "{e:?}");
        assert!(!e.name.is_empty() && e.name.chars().count() <= MAX_NAME);
        assert!(!e.name.contains('\n'));
        let found = fuzzing::find(&map, e.start).expect("an entry's start finds an entry");
        assert!(found.start <= e.start && e.start < found.end);
    }
});
