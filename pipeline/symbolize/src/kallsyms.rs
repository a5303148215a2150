//! The kernel's text symbols from `/proc/kallsyms`, in one sorted table.

/// The most of `/proc/kallsyms` read: a distribution kernel with its
/// modules lists about 200,000 symbols in 10 MB.
pub const MAX_KALLSYMS_BYTES: u64 = 64 << 20;

/// The kernel's text symbols: addresses sorted, names in one string (about
/// 4 MB for 120,000 symbols, a fifth of what a general symbolizer keeps).
#[derive(Default)]
pub struct Kallsyms {
    addrs: Vec<u64>,
    /// Each symbol's name in `names` (start, end), in the order of `addrs`.
    spans: Vec<(u32, u32)>,
    names: String,
}

/// One text symbol of a `/proc/kallsyms` line (`ADDR TYPE NAME [MODULE]`).
fn text_symbol(line: &[u8]) -> Option<(u64, &str)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut f = line.split_whitespace();
    let addr = u64::from_str_radix(f.next()?, 16).ok()?;
    let ty = f.next()?;
    let name = f.next()?;
    (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then_some((addr, name))
}

/// Calls `each` with every text symbol of `r`, reading one line at a time.
fn each_symbol(mut r: impl std::io::BufRead, mut each: impl FnMut(u64, &str)) {
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            // A last line cut by the read bound is not a whole symbol.
            Ok(_) if line.last() != Some(&b'\n') => return,
            Ok(_) => {}
        }
        if let Some((addr, name)) = text_symbol(&line) {
            each(addr, name);
        }
    }
}

impl Kallsyms {
    /// This machine's `/proc/kallsyms` (empty when it cannot be read, or
    /// when `kptr_restrict` hides the addresses from this user), opened
    /// only if it is a regular file ([`super::open`]: a bind mount could
    /// put a FIFO there) and read up to [`MAX_KALLSYMS_BYTES`]. It is read
    /// twice, a line at a time: once to size the table, once to fill it,
    /// so that neither its text nor a growing table is ever held whole.
    pub fn from_proc() -> Kallsyms {
        let open = || {
            super::open::open_regular(std::path::Path::new("/proc/kallsyms"), MAX_KALLSYMS_BYTES)
                .ok()
                .map(|r| {
                    use std::io::Read;
                    std::io::BufReader::with_capacity(64 << 10, r.file.take(MAX_KALLSYMS_BYTES))
                })
        };
        let Some(first) = open() else {
            return Kallsyms::default();
        };
        let (mut n, mut bytes) = (0usize, 0usize);
        each_symbol(first, |_, name| {
            n += 1;
            bytes += name.len();
        });
        match open() {
            Some(second) => Kallsyms::read(second, n, bytes),
            None => Kallsyms::default(),
        }
    }

    /// Reads `/proc/kallsyms` text (`ADDR TYPE NAME [MODULE]`), keeping text
    /// symbols (t, T, w, W). All-zero addresses (kptr_restrict) give none.
    pub fn parse(text: &str) -> Kallsyms {
        let (mut n, mut bytes) = (0usize, 0usize);
        each_symbol(text.as_bytes(), |_, name| {
            n += 1;
            bytes += name.len();
        });
        Kallsyms::read(text.as_bytes(), n, bytes)
    }

    /// At most `n` symbols and `bytes` of names from `r` (what a first
    /// pass counted: a module loaded since adds none), sorted by address.
    fn read(r: impl std::io::BufRead, n: usize, bytes: usize) -> Kallsyms {
        let mut k = Kallsyms {
            addrs: Vec::with_capacity(n),
            spans: Vec::with_capacity(n),
            names: String::with_capacity(bytes),
        };
        each_symbol(r, |addr, name| {
            if k.addrs.len() == n || k.names.len() + name.len() > bytes {
                return;
            }
            let start = k.names.len() as u32;
            k.names.push_str(name);
            k.addrs.push(addr);
            k.spans.push((start, k.names.len() as u32));
        });
        // The kernel lists its own symbols in address order and each
        // module's after; sorted here only when they are not.
        if !k.addrs.is_sorted() {
            let mut order: Vec<u32> = (0..k.addrs.len() as u32).collect();
            order.sort_unstable_by_key(|&i| k.addrs[i as usize]);
            k.addrs = order.iter().map(|&i| k.addrs[i as usize]).collect();
            k.spans = order.iter().map(|&i| k.spans[i as usize]).collect();
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
        let (start, end) = self.spans[i];
        self.names.get(start as usize..end as usize)
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
        // Out of order (a module listed before the kernel's own symbols).
        let k = Kallsyms::parse(
            "ffffffffc0000000 t mod_fn\t[ext4]\nffffffff81000000 T _stext\nffffffff81000100 t helper\n",
        );
        assert_eq!(k.lookup(0xffffffff81000050), Some("_stext"));
        assert_eq!(k.lookup(0xffffffff81000150), Some("helper"));
        assert_eq!(k.lookup(0xffffffffc0000010), Some("mod_fn"));
    }

    #[test]
    fn this_machines_kallsyms_is_read_in_two_passes() {
        let k = Kallsyms::from_proc();
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        if k.is_empty() {
            // kptr_restrict hides the addresses from this user.
            assert!(text.starts_with("0000000000000000 "), "{}", &text[..80]);
            return;
        }
        assert!(k.addrs.is_sorted());
        let (addr, name) = text
            .lines()
            .filter_map(|l| text_symbol(l.as_bytes()))
            .find(|&(_, n)| n == "schedule")
            .expect("the kernel has schedule");
        assert_eq!(k.lookup(addr), Some(name));
    }
}
