//! The kernel's text symbols from `/proc/kallsyms`, in one sorted table.

/// The most of `/proc/kallsyms` read: a distribution kernel with its
/// modules lists about 200,000 symbols in 10 MB.
pub const MAX_KALLSYMS_BYTES: u64 = 64 << 20;

/// The kernel's text symbols: addresses sorted, names in one string (about
/// 4 MB for 120,000 symbols, a fifth of what a general symbolizer keeps).
pub struct Kallsyms {
    addrs: Vec<u64>,
    /// End of each name in `names` (its start is the previous end).
    ends: Vec<u32>,
    names: String,
}

impl Kallsyms {
    /// This machine's `/proc/kallsyms` (empty when it cannot be read, or
    /// when `kptr_restrict` hides the addresses from this user), opened
    /// only if it is a regular file ([`super::open`]: a bind mount could
    /// put a FIFO there) and read up to [`MAX_KALLSYMS_BYTES`].
    pub fn from_proc() -> Kallsyms {
        let text =
            super::open::read_text(std::path::Path::new("/proc/kallsyms"), MAX_KALLSYMS_BYTES);
        Kallsyms::parse(&text.unwrap_or_default())
    }

    /// Reads `/proc/kallsyms` text (`ADDR TYPE NAME [MODULE]`), keeping text
    /// symbols (t, T, w, W). All-zero addresses (kptr_restrict) give none.
    pub fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let ty = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then_some((addr, name))
            })
            .collect();
        syms.sort_unstable_by_key(|&(a, _)| a);
        let mut k = Kallsyms {
            addrs: Vec::with_capacity(syms.len()),
            ends: Vec::with_capacity(syms.len()),
            names: String::with_capacity(syms.iter().map(|(_, n)| n.len()).sum()),
        };
        for (addr, name) in syms {
            k.addrs.push(addr);
            k.names.push_str(name);
            k.ends
                .push(u32::try_from(k.names.len()).unwrap_or(u32::MAX));
        }
        k
    }

    /// True when no symbol was read.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The symbol at or before `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.names.get(start..self.ends[i] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t helper\nffffffff81000200 D data\nffffffffc0000000 t mod_fn\t[ext4]\n0000000000000000 T hidden\n",
        );
        assert_eq!(k.lookup(0xffffffff81000050), Some("_stext"));
        assert_eq!(
            k.lookup(0xffffffff81000250),
            Some("helper"),
            "data symbols are skipped"
        );
        assert_eq!(k.lookup(0xffffffffc0000010), Some("mod_fn"));
        assert_eq!(k.lookup(0x1000), None);
    }
}
