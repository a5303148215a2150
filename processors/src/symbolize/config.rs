//! The `symbolize` processor's config. The cache settings have the names
//! and defaults of the `ebpf` receiver's, which symbolizes the same way.

use std::path::PathBuf;

use proflow_config::ByteSize;
use proflow_pipeline::component::FieldError;
use serde::Deserialize;

/// Config of the `symbolize` processor.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SymbolizeProcessorConfig {
    /// Look for each mapping's file on this host, at the path the profile
    /// names (first under `/proc/<pid>/root` when the series has a `pid`
    /// label, so files inside a container are found). A file is used only
    /// when its build id is the mapping's (or the mapping has none).
    /// Default true.
    #[serde(default = "yes")]
    pub local: bool,
    /// Directories holding debug files by build id
    /// (`<dir>/.build-id/ab/cdef….debug`, as distributions install them),
    /// also searched for a binary's `.gnu_debuglink`. Default
    /// `[/usr/lib/debug]`.
    #[serde(default = "default_debug_dirs")]
    pub debug_dirs: Vec<PathBuf>,
    /// Name kernel frames (a mapping named `[kernel.kallsyms]`, or an
    /// address in the kernel's half without a mapping) from this host's
    /// `/proc/kallsyms`. Only right for profiles of this host's kernel.
    /// Default true.
    #[serde(default = "yes")]
    pub kernel: bool,
    /// Most symbolized addresses kept (per file and address). Default 100000.
    #[serde(default = "default_symbol_cache_entries")]
    pub symbol_cache_entries: usize,
    /// Most files (binaries and debug files) whose symbol tables and DWARF
    /// stay open at once; the least recently used is closed beyond it.
    /// Default 32.
    #[serde(default = "default_open_binaries")]
    pub open_binaries: usize,
    /// Files whose DWARF (every `.debug_*` section, uncompressed) is larger
    /// are named from their symbol table only (no files, lines or inlined
    /// frames); files stay open while the DWARF of all open ones is at most
    /// twice this. Bounds the memory DWARF takes. Default 16MiB.
    #[serde(default = "default_max_debug_info")]
    pub max_debug_info: ByteSize,
}

impl Default for SymbolizeProcessorConfig {
    fn default() -> Self {
        SymbolizeProcessorConfig {
            local: true,
            debug_dirs: default_debug_dirs(),
            kernel: true,
            symbol_cache_entries: default_symbol_cache_entries(),
            open_binaries: default_open_binaries(),
            max_debug_info: default_max_debug_info(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_debug_dirs() -> Vec<PathBuf> {
    vec![PathBuf::from("/usr/lib/debug")]
}

fn default_symbol_cache_entries() -> usize {
    100_000
}

fn default_open_binaries() -> usize {
    32
}

fn default_max_debug_info() -> ByteSize {
    ByteSize::mib(16)
}

impl SymbolizeProcessorConfig {
    /// Every problem of this config.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut p = Vec::new();
        for (name, value) in [
            ("symbol_cache_entries", self.symbol_cache_entries),
            ("open_binaries", self.open_binaries),
        ] {
            if value == 0 {
                p.push(FieldError::new(name, "must be at least 1"));
            }
        }
        for (i, dir) in self.debug_dirs.iter().enumerate() {
            if !dir.is_absolute() {
                p.push(FieldError::new(
                    format!("debug_dirs.{i}"),
                    format!(
                        "`{}` is relative: give an absolute directory such as /usr/lib/debug",
                        dir.display()
                    ),
                ));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_every_problem() {
        let c: SymbolizeProcessorConfig = serde_saphyr::from_str("{}").unwrap();
        assert_eq!(c, SymbolizeProcessorConfig::default());
        assert!(c.problems().is_empty());
        let c: SymbolizeProcessorConfig = serde_saphyr::from_str(
            "{symbol_cache_entries: 0, open_binaries: 0, debug_dirs: [debug, /ok]}",
        )
        .unwrap();
        let problems = c.problems();
        let p: Vec<&str> = problems.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            p,
            ["symbol_cache_entries", "open_binaries", "debug_dirs.0"],
            "every problem, once"
        );
        assert!(
            serde_saphyr::from_str::<SymbolizeProcessorConfig>("{debuginfo: x}").is_err(),
            "unknown fields are refused"
        );
    }
}
