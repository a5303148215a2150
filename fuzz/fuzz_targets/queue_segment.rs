//! Segment files of a persistent exporter queue as a restart scans them,
//! and the same bytes as an acknowledgement file. The scan accounts for
//! every byte (header, intact frames, damage) without overlap, each record
//! it finds checks out, and a segment written of those records alone scans
//! clean; every acknowledgement read is an intact entry of that segment.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_core::queue::storage::segment::{
    self, ACK_ENTRY, FRAME_HEADER, SEGMENT_HEADER, fuzzing,
};

/// The longest record the scan takes (a queue's `max_record`).
const MAX_RECORD: u32 = 1 << 16;
const SEGMENT: u64 = 7;

fuzz_target!(|data: &[u8]| {
    let scan = fuzzing::scan(data, MAX_RECORD);
    assert_eq!(scan.len, data.len() as u64);
    // Records and damage in file order, each where the last one ended.
    let mut pieces: Vec<(u64, u64, Option<u32>)> = scan
        .records
        .iter()
        .map(|f| {
            (
                f.offset,
                FRAME_HEADER as u64 + u64::from(f.len),
                Some(f.len),
            )
        })
        .chain(scan.damage.iter().map(|d| (d.offset, d.skipped, None)))
        .collect();
    pieces.sort_unstable();
    let mut at = match scan.salt {
        Some(_) => SEGMENT_HEADER as u64,
        None => {
            assert!(scan.records.is_empty(), "records found without a salt");
            0
        }
    };
    for &(offset, len, record) in &pieces {
        assert_eq!(offset, at, "a gap or an overlap at byte {at}");
        assert!(len > 0 || record.is_some(), "empty damage");
        at = offset + len;
    }
    assert_eq!(
        at,
        data.len().max(if scan.salt.is_some() {
            SEGMENT_HEADER
        } else {
            0
        }) as u64
    );

    if let Some(salt) = scan.salt {
        let mut rebuilt = segment::segment_header(salt).to_vec();
        for f in &scan.records {
            assert!(f.len <= MAX_RECORD);
            let start = f.offset as usize + FRAME_HEADER;
            let record = &data[start..start + f.len as usize];
            let header = segment::frame_header(salt, record);
            assert_eq!(
                &data[f.offset as usize..start],
                &header,
                "a record that does not check out"
            );
            rebuilt.extend_from_slice(&header);
            rebuilt.extend_from_slice(record);
        }
        let again = fuzzing::scan(&rebuilt, MAX_RECORD);
        assert!(again.damage.is_empty(), "intact records scanned as damage");
        assert_eq!(again.records.len(), scan.records.len());
    }

    let acks = fuzzing::acks(data, SEGMENT);
    assert!(acks.len() <= data.len() / ACK_ENTRY);
    let entries: Vec<&[u8]> = data.chunks_exact(ACK_ENTRY).collect();
    for offset in acks {
        let entry = segment::ack_entry(SEGMENT, offset);
        assert!(
            entries.contains(&entry.as_slice()),
            "an acknowledgement that is not an entry"
        );
    }
});
