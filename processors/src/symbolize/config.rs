//! The `symbolize` processor's config. The cache settings have the names
//! and defaults of the `ebpf` receiver's, which symbolizes the same way.

use std::path::PathBuf;

use proflow_config::{ByteSize, Duration};
use proflow_core::component::FieldError;
use serde::Deserialize;

/// For which profiles a source that reads this host (its files, its
/// `/proc/kallsyms`) is used: `this_host`, `true` or `false` in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostSource {
    /// `this_host` (the default): only for the profiles proflow made on
    /// this host (the `ebpf` receiver's), whose paths and addresses are
    /// this host's. Profiles from elsewhere (pushed, from Kafka, scraped)
    /// are named by build id only.
    #[default]
    ThisHost,
    /// `true`: for every profile, whoever sent it (senders you trust).
    Every,
    /// `false`: for none.
    Never,
}

impl HostSource {
    /// Whether the source serves a profile that was (`this_host`) or was
    /// not made on this host.
    pub fn serves(self, this_host: bool) -> bool {
        match self {
            HostSource::ThisHost => this_host,
            HostSource::Every => true,
            HostSource::Never => false,
        }
    }
}

impl<'de> Deserialize<'de> for HostSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = HostSource;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "this_host (only the profiles of this host's ebpf receiver: the default), true (every profile, for senders you trust) or false (none)",
                )
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<HostSource, E> {
                Ok(if v {
                    HostSource::Every
                } else {
                    HostSource::Never
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HostSource, E> {
                match v {
                    "this_host" => Ok(HostSource::ThisHost),
                    "true" => Ok(HostSource::Every),
                    "false" => Ok(HostSource::Never),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Config of the `symbolize` processor.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SymbolizeProcessorConfig {
    /// Look for each mapping's file on this host, at the path the profile
    /// names (first under `/proc/<pid>/root` when the series has a `pid`
    /// label, so files inside a container are found). A file is used only
    /// when its build id is the mapping's (or the mapping has none). This
    /// opens paths the profiles name, so by default (`this_host`) only for
    /// the profiles proflow made on this host (its `ebpf` receiver's);
    /// `true` does it for every profile, pushed ones included (only for
    /// senders you trust: a crafted profile could learn the function names
    /// of any ELF file here); `false` never.
    #[serde(default)]
    pub local: HostSource,
    /// Directories holding debug files by build id
    /// (`<dir>/.build-id/ab/cdef….debug`, as distributions install them),
    /// also searched for a binary's `.gnu_debuglink`. Default
    /// `[/usr/lib/debug]`.
    #[serde(default = "default_debug_dirs")]
    pub debug_dirs: Vec<PathBuf>,
    /// Name kernel frames (a mapping named `[kernel.kallsyms]`, or an
    /// address in the kernel's half without a mapping) from this host's
    /// `/proc/kallsyms`. Only right for profiles of this host's kernel, and
    /// an answer to "what is at this kernel address" (which kernel address
    /// randomization hides), so by default (`this_host`) only for the
    /// profiles of this host's `ebpf` receiver; `true` for every profile
    /// (senders on this host you trust), `false` never.
    #[serde(default)]
    pub kernel: HostSource,
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
    /// twice this, and a file no new address needed for a minute is closed
    /// when the next new address is looked up.
    /// Bounds the memory DWARF takes. Default 16MiB.
    #[serde(default = "default_max_debug_info")]
    pub max_debug_info: ByteSize,
    /// debuginfod servers to fetch debug files from by build id, after
    /// `debug_dirs` and for local binaries without DWARF.
    #[serde(default)]
    pub debuginfod: DebuginfodConfig,
}

/// The `debuginfod` block of the `symbolize` processor.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DebuginfodConfig {
    /// Server URLs (`http://` or `https://`), tried in order. When unset,
    /// the space-separated `DEBUGINFOD_URLS` environment variable, as
    /// elfutils' client reads it; empty (or unset with no variable) turns
    /// debuginfod off.
    #[serde(default)]
    pub urls: Option<Vec<String>>,
    /// How long a batch of profiles waits for the fetches it needs; then
    /// their frames go on unnamed (`proflow_symbolize_frames_total{result="debuginfod_timeout"}`)
    /// and the fetches go on for later profiles. Default 2s.
    #[serde(default = "default_debuginfod_timeout")]
    pub timeout: Duration,
    /// Longest one fetch may take. Default 5m.
    #[serde(default = "default_fetch_timeout")]
    pub fetch_timeout: Duration,
    /// Where fetched debug files are kept, one directory per build id.
    /// Default `$XDG_CACHE_HOME/proflow/debuginfod`, else
    /// `$HOME/.cache/proflow/debuginfod`, else (neither set)
    /// `<temp dir>/proflow-<uid>/cache/proflow/debuginfod`, its first folder
    /// made with mode 0700 and refused if it is not this user's own.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache holds; the least recently fetched files are
    /// deleted beyond it. Default 1GiB.
    #[serde(default = "default_max_cache_size")]
    pub max_cache_size: ByteSize,
    /// Largest debug file fetched; a fetch holds the file in memory while
    /// it arrives. Default 256MiB.
    #[serde(default = "default_max_file_size")]
    pub max_file_size: ByteSize,
    /// How long a build id that no server had (or whose fetch failed) is
    /// not asked for again. Default 10m.
    #[serde(default = "default_negative_ttl")]
    pub negative_ttl: Duration,
    /// Most fetches at once. Default 2.
    #[serde(default = "default_max_concurrent_fetches")]
    pub max_concurrent_fetches: usize,
}

impl Default for DebuginfodConfig {
    fn default() -> Self {
        DebuginfodConfig {
            urls: None,
            timeout: default_debuginfod_timeout(),
            fetch_timeout: default_fetch_timeout(),
            cache_dir: None,
            max_cache_size: default_max_cache_size(),
            max_file_size: default_max_file_size(),
            negative_ttl: default_negative_ttl(),
            max_concurrent_fetches: default_max_concurrent_fetches(),
        }
    }
}

impl DebuginfodConfig {
    /// The server URLs: configured, else from `DEBUGINFOD_URLS`; without
    /// trailing slashes.
    pub fn resolved_urls(&self) -> Vec<String> {
        let urls: Vec<String> = match &self.urls {
            Some(u) => u.clone(),
            None => std::env::var("DEBUGINFOD_URLS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        };
        urls.into_iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// The cache directory: configured, else under the user's cache, else
    /// (neither `XDG_CACHE_HOME` nor `HOME` set) a directory of this user's
    /// own under the temporary directory, `proflow-<uid>`, which
    /// [`private_dir`] makes or checks before it is used.
    pub fn resolved_cache_dir(&self) -> PathBuf {
        if let Some(d) = &self.cache_dir {
            return d.clone();
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| private_temp_base().join("cache"));
        base.join("proflow").join("debuginfod")
    }

    /// [`Self::resolved_cache_dir`], with the private temporary directory
    /// made (or checked) first when that is where it falls back to.
    pub fn prepared_cache_dir(&self) -> Result<PathBuf, String> {
        let dir = self.resolved_cache_dir();
        let base = private_temp_base();
        if dir.starts_with(&base) {
            private_dir(&base)?;
        }
        Ok(dir)
    }
}

/// This user's directory under the temporary directory: `proflow-<uid>`.
fn private_temp_base() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    std::env::temp_dir().join(format!("proflow-{uid}"))
}

/// Makes `dir` with mode 0700, or checks the one there: a directory (not a
/// symbolic link) owned by this process's user that no one else may enter.
/// Another local user could otherwise make it first, in a shared temporary
/// directory, and fill it with files proflow would read as debug files.
pub fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    let me = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private directory of this user (a symbolic link, another owner, or open to others): set `debuginfod.cache_dir`, or HOME or XDG_CACHE_HOME",
            dir.display()
        ));
    }
    Ok(())
}

fn default_debuginfod_timeout() -> Duration {
    Duration::from_secs(2)
}

fn default_fetch_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_max_cache_size() -> ByteSize {
    ByteSize::mib(1024)
}

fn default_max_file_size() -> ByteSize {
    ByteSize::mib(256)
}

fn default_negative_ttl() -> Duration {
    Duration::from_secs(600)
}

fn default_max_concurrent_fetches() -> usize {
    2
}

impl Default for SymbolizeProcessorConfig {
    fn default() -> Self {
        SymbolizeProcessorConfig {
            local: HostSource::ThisHost,
            debug_dirs: default_debug_dirs(),
            kernel: HostSource::ThisHost,
            symbol_cache_entries: default_symbol_cache_entries(),
            open_binaries: default_open_binaries(),
            max_debug_info: default_max_debug_info(),
            debuginfod: DebuginfodConfig::default(),
        }
    }
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
        for (i, url) in self.debuginfod.urls.iter().flatten().enumerate() {
            let ok = ["http://", "https://"].iter().any(|scheme| {
                url.strip_prefix(scheme)
                    .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
            });
            if !ok {
                p.push(FieldError::new(
                    format!("debuginfod.urls.{i}"),
                    format!(
                        "`{url}` is not an http:// or https:// URL (such as http://127.0.0.1:8002)"
                    ),
                ));
            }
        }
        if self.debuginfod.max_concurrent_fetches == 0 {
            p.push(FieldError::new(
                "debuginfod.max_concurrent_fetches",
                "must be at least 1",
            ));
        }
        if self.debuginfod.timeout.is_zero() || self.debuginfod.fetch_timeout.is_zero() {
            p.push(FieldError::new(
                "debuginfod",
                "timeout and fetch_timeout must be more than 0s",
            ));
        }
        if self.debuginfod.max_file_size.bytes() > self.debuginfod.max_cache_size.bytes() {
            p.push(FieldError::new(
                "debuginfod.max_file_size",
                "is larger than max_cache_size: such a file would be deleted as soon as it is stored",
            ));
        }
        if let Some(d) = &self.debuginfod.cache_dir
            && !d.is_absolute()
        {
            p.push(FieldError::new(
                "debuginfod.cache_dir",
                format!("`{}` is relative: give an absolute directory", d.display()),
            ));
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

    #[test]
    fn local_and_kernel_default_to_this_hosts_profiles_and_take_true_and_false() {
        let c: SymbolizeProcessorConfig = serde_saphyr::from_str("{}").unwrap();
        assert_eq!(
            (c.local, c.kernel),
            (HostSource::ThisHost, HostSource::ThisHost)
        );
        for (yaml, want) in [
            ("true", HostSource::Every),
            ("false", HostSource::Never),
            ("this_host", HostSource::ThisHost),
            ("'true'", HostSource::Every),
        ] {
            let c: SymbolizeProcessorConfig =
                serde_saphyr::from_str(&format!("{{local: {yaml}, kernel: {yaml}}}")).unwrap();
            assert_eq!((c.local, c.kernel), (want, want), "{yaml}");
        }
        let e = serde_saphyr::from_str::<SymbolizeProcessorConfig>("{local: yes_please}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("this_host"), "the error names the values: {e}");
        assert!(HostSource::ThisHost.serves(true) && !HostSource::ThisHost.serves(false));
        assert!(HostSource::Every.serves(false) && !HostSource::Never.serves(true));
    }
}
