//! Names a pprof profile's unnamed locations: each location with an
//! address and no lines gets the lines its mapping's file gives (inlined
//! frames first), functions and strings are added once each, and a mapping
//! all of whose asked locations were named is marked `has_functions` (and
//! `has_filenames`, `has_line_numbers`, `has_inline_frames` as found).
//! Locations that already have lines are left as they are, and so are
//! addresses: pprof tools look an address up as it is (a producer that
//! records return addresses subtracts one byte first, as proflow's `ebpf`
//! receiver does).

use std::collections::HashMap;

use proflow_model::pprof;
use proflow_symbolize::{FastMap, Lines, Symbols};

use super::sources::{self, AddressKind, KERNEL_START, MappingId, Source, Sources, reason};

/// Frames by result (`symbolized` or the reason they were not).
pub type Counts = HashMap<&'static str, u64>;

/// Per mapping index: (asked, named, with files, with lines, inlined).
type MappingStats = FastMap<usize, [u64; 5]>;

/// Names the profile's unnamed locations in place. True when it changed;
/// false when it had none to name or none could be (it then goes on as it
/// came, never re-encoded). The frames are counted by result either way.
pub fn symbolize(
    profile: &mut pprof::Profile,
    pid: Option<u32>,
    sources: &mut Sources,
    symbols: &mut Symbols,
) -> (bool, Counts) {
    let mut counts = Counts::new();
    let todo = unnamed_locations(profile);
    if todo.is_empty() {
        return (false, counts);
    }
    let mappings = MappingSources::find(profile, &todo, pid, sources);
    let mut per_mapping = MappingStats::default();
    let named = look_up_lines(
        profile,
        todo,
        &mappings,
        symbols,
        &mut per_mapping,
        &mut counts,
    );
    if named.is_empty() || !add_lines(profile, named) {
        return (false, counts);
    }
    mark_named_mappings(&mut profile.mapping, per_mapping);
    (true, counts)
}

/// The indexes of the locations with an address and no lines.
fn unnamed_locations(profile: &pprof::Profile) -> Vec<usize> {
    profile
        .location
        .iter()
        .enumerate()
        .filter(|(_, l)| l.line.is_empty() && l.address != 0)
        .map(|(i, _)| i)
        .collect()
}

/// String `i` of `table` (`""` when there is none).
fn string(table: &[String], i: i64) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .map_or("", String::as_str)
}

/// Where the symbols of the profile's locations are.
struct MappingSources {
    /// Each mapping's index by its id.
    index: FastMap<u64, usize>,
    /// Each mapping's source, found once (by mapping index).
    found: Vec<Option<Source>>,
    kernel: Source,
    no_mapping: Source,
}

impl MappingSources {
    /// Finds the source of each mapping that a location of `todo` is in.
    fn find(
        profile: &pprof::Profile,
        todo: &[usize],
        pid: Option<u32>,
        sources: &mut Sources,
    ) -> Self {
        let index: FastMap<u64, usize> = profile
            .mapping
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id, i))
            .collect();
        let mut found: Vec<Option<Source>> = vec![None; profile.mapping.len()];
        for &i in todo {
            if let Some(&mi) = index.get(&profile.location[i].mapping_id)
                && found[mi].is_none()
            {
                let mapping = &profile.mapping[mi];
                let table = &profile.string_table;
                found[mi] = Some(sources.find(&MappingId {
                    path: string(table, mapping.filename).to_owned(),
                    build_id: sources::normalize_build_id(string(table, mapping.build_id)),
                    pid,
                }));
            }
        }
        MappingSources {
            index,
            found,
            kernel: sources.kernel(),
            no_mapping: Source::Missing(reason::NO_MAPPING),
        }
    }

    /// The index of the location's mapping (if it has one) and where its
    /// symbols are.
    fn of(&self, loc: &pprof::Location) -> (Option<usize>, &Source) {
        let m = self.index.get(&loc.mapping_id).copied();
        let source = match m {
            None if loc.address >= KERNEL_START => &self.kernel,
            None => &self.no_mapping,
            Some(mi) => self.found[mi].as_ref().unwrap_or(&self.no_mapping),
        };
        (m, source)
    }
}

/// Looks up the lines of each location of `todo`, counting the frames by
/// result and per mapping; the lines of those named, by location index.
fn look_up_lines(
    profile: &pprof::Profile,
    todo: Vec<usize>,
    mappings: &MappingSources,
    symbols: &mut Symbols,
    per_mapping: &mut MappingStats,
    counts: &mut Counts,
) -> Vec<(usize, Lines)> {
    let mut named: Vec<(usize, Lines)> = Vec::with_capacity(todo.len());
    for i in todo {
        let loc = &profile.location[i];
        let (m, source) = mappings.of(loc);
        let kind = match m {
            Some(mi) => {
                let mapping = &profile.mapping[mi];
                AddressKind::Runtime {
                    memory_start: mapping.memory_start,
                    memory_limit: mapping.memory_limit,
                    file_offset: mapping.file_offset,
                }
            }
            None => AddressKind::Virtual,
        };
        let lines = sources::lookup(source, loc.address, kind, symbols);
        let stats = m.map(|mi| per_mapping.entry(mi).or_default());
        let lines = match lines {
            Ok(l) => Some(l),
            Err(why) => {
                *counts.entry(why).or_default() += 1;
                None
            }
        };
        if let Some(s) = stats {
            s[0] += 1;
            if let Some(lines) = &lines {
                s[1] += 1;
                s[2] += u64::from(lines.iter().any(|l| l.file.is_some()));
                s[3] += u64::from(lines.iter().any(|l| l.line != 0));
                s[4] += u64::from(lines.len() > 1);
            }
        }
        if let Some(lines) = lines {
            *counts.entry(reason::SYMBOLIZED).or_default() += 1;
            named.push((i, lines));
        }
    }
    named
}

/// Gives each named location its lines, adding the functions and strings
/// they need (each once). False, with nothing changed, when the function
/// ids leave no room for the new functions.
fn add_lines(out: &mut pprof::Profile, named: Vec<(usize, Lines)>) -> bool {
    let mut strings = Strings::default();
    let mut functions: FastMap<(i64, i64), u64> = out
        .function
        .iter()
        .map(|f| ((f.name, f.filename), f.id))
        .collect();
    // New functions get ids after the largest there is; ids that leave no
    // room (a sender's u64::MAX) mean the profile goes on as it came.
    let new_lines: usize = named.iter().map(|(_, l)| l.len()).sum();
    let max_id = out.function.iter().map(|f| f.id).max().unwrap_or(0);
    let Some(mut next_function) = max_id
        .checked_add(1)
        .filter(|n| n.checked_add(new_lines as u64).is_some())
    else {
        return false;
    };
    for (i, lines) in named {
        out.location[i].line = lines
            .iter()
            .map(|l| {
                let name = strings.get(&mut out.string_table, &l.function);
                let file = match &l.file {
                    Some(f) => strings.get(&mut out.string_table, f),
                    None => 0,
                };
                let id = *functions.entry((name, file)).or_insert_with(|| {
                    let id = next_function;
                    next_function += 1;
                    out.function.push(pprof::Function {
                        id,
                        name,
                        system_name: name,
                        filename: file,
                        start_line: 0,
                    });
                    id
                });
                pprof::Line {
                    function_id: id,
                    line: i64::from(l.line),
                    column: 0,
                }
            })
            .collect();
    }
    true
}

/// Marks each mapping all of whose asked locations were named as having
/// functions (and files, line numbers and inlined frames, as found).
fn mark_named_mappings(mappings: &mut [pprof::Mapping], per_mapping: MappingStats) {
    for (mi, [asked, named, files, lines, inlined]) in per_mapping {
        if asked > 0 && named == asked {
            let m = &mut mappings[mi];
            m.has_functions = true;
            m.has_filenames |= files > 0;
            m.has_line_numbers |= lines > 0;
            m.has_inline_frames |= inlined > 0;
        }
    }
}

/// The string table's index, made on first use.
#[derive(Default)]
struct Strings {
    index: Option<FastMap<String, i64>>,
}

impl Strings {
    fn get(&mut self, table: &mut Vec<String>, s: &str) -> i64 {
        let index = self.index.get_or_insert_with(|| {
            let mut m = FastMap::with_capacity_and_hasher(table.len(), Default::default());
            for (i, t) in table.iter().enumerate() {
                m.entry(t.clone()).or_insert(i as i64);
            }
            m
        });
        if let Some(&i) = index.get(s) {
            return i;
        }
        if table.is_empty() {
            // pprof's string 0 is always "".
            table.push(String::new());
            index.insert(String::new(), 0);
        }
        let i = table.len() as i64;
        table.push(s.to_owned());
        index.insert(s.to_owned(), i);
        i
    }
}
