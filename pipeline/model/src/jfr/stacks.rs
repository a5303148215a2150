//! Stack traces out of the constant pools, as Pyroscope names their frames:
//! `<class>.<method>` with the class in the JVM's internal form
//! (`java/lang/Thread.run`; for async-profiler's native frames the library
//! stands for the class: `libc.so.6.start_thread`), leaf first, with the
//! frame's line number. A frame whose method or class cannot be found is
//! left out (as Pyroscope leaves it out) and counted. Every stack is resolved once and kept by its key, every
//! method's name once by the method's key, both taken from the [`Meter`].

use super::HashMap;

use super::cursor::JfrString;
use super::metadata::{Class, Metadata};
use super::pools::Pools;
use super::values::{Value, array_len, field_class, read_flat, skip_field};
use super::{Meter, Result};

/// One frame: its method's key (see [`Stacks::name`]) and its line (0 when
/// unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub method: u64,
    pub line: u32,
}

/// Resolves stack-trace keys of one chunk.
pub struct Stacks<'a> {
    md: &'a Metadata,
    pools: &'a Pools<'a>,
    ids: Ids<'a>,
    /// Stack-trace key → whether it has a frame that can be named.
    nonempty: HashMap<u64, bool>,
    /// Frames being read (kept for its room).
    scratch: Vec<Frame>,
    /// Method key → `class.method`, or `None` when it cannot be named.
    names: HashMap<u64, Option<String>>,
}

/// The class ids and field positions the resolution needs.
#[derive(Debug, Default, Clone, Copy)]
struct Ids<'a> {
    stack_trace: Option<&'a Class>,
    frames: Option<usize>,
    frame_method: Option<usize>,
    frame_line: Option<usize>,
    method: Option<&'a Class>,
    method_type: Option<usize>,
    method_name: Option<usize>,
    class: Option<&'a Class>,
    class_name: Option<usize>,
    symbol: Option<&'a Class>,
    symbol_string: Option<usize>,
    string: Option<&'a Class>,
}

impl<'a> Stacks<'a> {
    pub fn new(md: &'a Metadata, pools: &'a Pools<'a>) -> Self {
        let class = |name: &str| md.class_named(name);
        let field = |name: &str, f: &str| class(name).and_then(|c| c.field(f));
        let ids = Ids {
            stack_trace: class("jdk.types.StackTrace"),
            frames: field("jdk.types.StackTrace", "frames"),
            frame_method: field("jdk.types.StackFrame", "method"),
            frame_line: field("jdk.types.StackFrame", "lineNumber"),
            method: class("jdk.types.Method"),
            method_type: field("jdk.types.Method", "type"),
            method_name: field("jdk.types.Method", "name"),
            class: class("java.lang.Class"),
            class_name: field("java.lang.Class", "name"),
            symbol: class("jdk.types.Symbol"),
            symbol_string: field("jdk.types.Symbol", "string"),
            string: class("java.lang.String"),
        };
        Stacks {
            md,
            pools,
            ids,
            nonempty: HashMap::default(),
            scratch: Vec::new(),
            names: HashMap::default(),
        }
    }

    /// Whether stack trace `key` has a frame that can be named; the first
    /// time a key is asked, its methods are named (and kept).
    pub fn has_frames(&mut self, key: u64, meter: &mut Meter<'_>) -> Result<bool> {
        if let Some(&known) = self.nonempty.get(&key) {
            return Ok(known);
        }
        let mut frames = std::mem::take(&mut self.scratch);
        let had = frames.capacity();
        self.raw_frames(key, &mut frames)?;
        // Only its growth is new.
        meter.take(frames.capacity().saturating_sub(had) * std::mem::size_of::<Frame>())?;
        let mut any = false;
        for f in &frames {
            if !self.names.contains_key(&f.method) {
                let name = self.method_name(f.method, meter)?;
                self.names.insert(f.method, name);
            }
            any |= self.names[&f.method].is_some();
        }
        self.scratch = frames;
        meter.take(2 * std::mem::size_of::<(u64, bool)>())?;
        self.nonempty.insert(key, any);
        Ok(any)
    }

    /// The frames of stack trace `key` whose methods have names, leaf first,
    /// into `out` (read again from the pool: nothing is kept per stack);
    /// returns how many frames were left out (no method, or a method that
    /// cannot be named). The key must have been asked with
    /// [`Stacks::has_frames`].
    pub fn frames_into(&self, key: u64, out: &mut Vec<Frame>) -> Result<usize> {
        let without_method = self.raw_frames(key, out)?;
        let read = out.len();
        out.retain(|f| self.names.get(&f.method).is_some_and(Option::is_some));
        Ok(without_method + (read - out.len()))
    }

    /// Every frame of stack trace `key` that names a method, read flat from
    /// its pool entry; returns how many frames named none.
    fn raw_frames(&self, key: u64, out: &mut Vec<Frame>) -> Result<usize> {
        out.clear();
        let ids = self.ids;
        let (Some(trace), Some(frames_at)) = (ids.stack_trace, ids.frames) else {
            return Ok(0);
        };
        let Some(mut c) = self.pools.cursor_at(trace.id, key) else {
            return Ok(0);
        };
        let mut without_method = 0;
        let mut values = Vec::new();
        for (i, field) in trace.fields.iter().enumerate() {
            if i != frames_at || !field.array || field.constant_pool {
                skip_field(&mut c, self.md, field, 1)?;
                continue;
            }
            let frame_class = field_class(&c, self.md, field)?;
            let n = array_len(&mut c, self.md, field)?;
            // Each frame takes at least a byte: `n` is within the chunk.
            out.reserve(n);
            for _ in 0..n {
                read_flat(&mut c, self.md, frame_class, &mut values)?;
                let get = |at: Option<usize>| at.and_then(|i| values.get(i)).copied();
                let Some(method) = get(ids.frame_method) else {
                    without_method += 1;
                    continue;
                };
                let line = get(ids.frame_line)
                    .and_then(|l| u32::try_from(l).ok())
                    // No line is written as -1 in 32 bits.
                    .filter(|&l| l != u32::MAX)
                    .unwrap_or(0);
                out.push(Frame { method, line });
            }
        }
        Ok(without_method)
    }

    /// The name of a frame's method.
    pub fn name(&self, method: u64) -> &str {
        self.names
            .get(&method)
            .and_then(Option::as_deref)
            .unwrap_or_default()
    }

    /// Entry `key` of the pool of `class` (if both are known): read, and
    /// what it held given back once `f` has used it.
    fn with_entry<T>(
        &self,
        class: Option<&Class>,
        key: u64,
        meter: &mut Meter<'_>,
        f: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>> {
        let Some(class) = class else {
            return Ok(None);
        };
        let before = meter.held();
        let value = self.pools.value(self.md, class, key, meter)?;
        let out = value.as_ref().and_then(f);
        drop(value);
        meter.give_back(meter.held() - before);
        Ok(out)
    }

    /// `class.method` for method `key`, taken from `meter` before it is kept.
    fn method_name(&self, key: u64, meter: &mut Meter<'_>) -> Result<Option<String>> {
        let ids = self.ids;
        meter.take(2 * std::mem::size_of::<(u64, Option<String>)>())?;
        let Some((class, name)) = self.with_entry(ids.method, key, meter, |m| {
            Some((
                m.fields().get(ids.method_type?)?.int()?,
                m.fields().get(ids.method_name?)?.int()?,
            ))
        })?
        else {
            return Ok(None);
        };
        let Some(class_name) = self.with_entry(ids.class, class, meter, |c| {
            c.fields().get(ids.class_name?)?.int()
        })?
        else {
            return Ok(None);
        };
        let (Some(class_name), Some(name)) =
            (self.symbol(class_name, meter)?, self.symbol(name, meter)?)
        else {
            return Ok(None);
        };
        meter.take(class_name.len() + 1 + name.len())?;
        Ok(Some(format!("{class_name}.{name}")))
    }

    /// Symbol `key`'s text, with generated names made stable.
    fn symbol(&self, key: u64, meter: &mut Meter<'_>) -> Result<Option<String>> {
        let ids = self.ids;
        let text = self.with_entry(ids.symbol, key, meter, |symbol| {
            match symbol.fields().get(ids.symbol_string?)? {
                Value::Str(JfrString::Text(s)) => Some(Ok(s.clone())),
                Value::Str(JfrString::PoolKey(k)) => Some(Err(*k)),
                _ => None,
            }
        })?;
        let text = match text {
            Some(Ok(s)) => Some(s),
            Some(Err(k)) => self.with_entry(ids.string, k, meter, |s| match s {
                Value::Str(JfrString::Text(s)) => Some(s.clone()),
                _ => None,
            })?,
            None => None,
        };
        Ok(text.map(stable_symbol))
    }
}

/// A symbol with the parts the JVM generates anew in every run replaced
/// by `_`, as Pyroscope does, so that the same code has one name across
/// uploads:
/// - `jdk/internal/reflect/GeneratedMethodAccessor31` →
///   `jdk/internal/reflect/GeneratedMethodAccessor_`;
/// - a lambda's class, `a/B$$Lambda$669.0x0000000800fd7318` or
///   `a/B$$Lambda.0x00007ffa600c4da0` or `a/B$$Lambda/0x…` → `a/B$$Lambda_`;
/// - `…$$EnhancerBySpringCGLIB$$1a2b3c` → `…$$EnhancerBySpringCGLIB$$_`;
/// - the temporary file names of libzstd-jni, Amazon Corretto Crypto
///   Provider and the agent's own async-profiler library.
pub fn stable_symbol(s: String) -> String {
    const ACCESSOR: &str = "jdk/internal/reflect/GeneratedMethodAccessor";
    if let Some(n) = s.strip_prefix(ACCESSOR)
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
    {
        return format!("{ACCESSOR}_");
    }
    if let Some(i) = s.rfind("$$Lambda") {
        let rest = &s[i + "$$Lambda".len()..];
        if i > 0 && lambda_suffix(rest) {
            return format!("{}$$Lambda_", &s[..i]);
        }
    }
    const CGLIB: &str = "$$EnhancerBySpringCGLIB$$";
    if let Some(i) = s.find(CGLIB)
        && i > 0
    {
        return format!("{}_", &s[..i + CGLIB.len()]);
    }
    stable_library(&s).unwrap_or(s)
}

/// What follows `$$Lambda` in a generated lambda class: `$669.0x7f…`,
/// `.0x7f…`, `/0x7f…`, `$12` or digits (`\$?\d*[./](0x)?[0-9a-f]+|\d+`).
fn lambda_suffix(rest: &str) -> bool {
    if !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let rest = rest.strip_prefix('$').unwrap_or(rest);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let rest = &rest[digits..];
    let Some(rest) = rest.strip_prefix(['.', '/']) else {
        return false;
    };
    let rest = rest.strip_prefix("0x").unwrap_or(rest);
    !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The stable name of a native library extracted to a temporary file.
fn stable_library(s: &str) -> Option<String> {
    let s = s.strip_suffix(" (deleted)").unwrap_or(s);
    let s = s
        .strip_prefix("./tmp/")
        .or_else(|| s.strip_prefix("/tmp/"))
        .unwrap_or(s);
    let hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    // libzstd-jni-1.5.1-16931311898282279136.so
    if let Some(rest) = s
        .strip_prefix("libzstd-jni-")
        .and_then(|r| r.strip_suffix(".so"))
    {
        let mut parts = rest.splitn(2, '-');
        let (version, id) = (parts.next()?, parts.next()?);
        let v: Vec<&str> = version.split('.').collect();
        if v.len() == 3 && v.iter().all(|p| digits(p)) && digits(id) {
            return Some("libzstd-jni-_.so".into());
        }
    }
    // libamazonCorrettoCryptoProvider109b39cf33c563eb.so,
    // amazonCorrettoCryptoProviderNativeLibraries.7382c2f79097f415/libcrypto.so
    let acc = s.strip_prefix("lib").unwrap_or(s);
    if let Some(rest) = acc.strip_prefix("amazonCorrettoCryptoProvider") {
        let rest = rest.strip_prefix("NativeLibraries.").unwrap_or(rest);
        if rest.len() >= 16 && rest.is_char_boundary(16) && hex(&rest[..16]) {
            let tail = &rest[16..];
            let tail = tail
                .strip_prefix("/libcrypto")
                .or_else(|| tail.strip_prefix("/libamazonCorrettoCryptoProvider"))
                .unwrap_or(tail);
            if tail == ".so" {
                return Some("libamazonCorrettoCryptoProvider_.so".into());
            }
        }
    }
    // libasyncProfiler-linux-x64-17b9a1d8156277a98ccc871afa9a8f69215f92.so
    if let Some(rest) = s
        .strip_prefix("libasyncProfiler-")
        .and_then(|r| r.strip_suffix(".so"))
    {
        for platform in ["linux-arm64-", "linux-musl-x64-", "linux-x64-", "macos-"] {
            if rest.strip_prefix(platform) == Some("17b9a1d8156277a98ccc871afa9a8f69215f92") {
                return Some("libasyncProfiler-_.so".into());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::chunk::HEADER_LEN;
    use super::super::cursor::Cursor;
    use super::super::metadata::tests::{metadata_event, sized, utf8, varint};
    use super::*;

    /// One pool's entries: key, and the entry's fields already written.
    type Entries = Vec<(u64, Vec<u8>)>;

    /// A checkpoint event of `pools`: (class id, entries).
    fn checkpoint(pools: &[(u64, Entries)]) -> Vec<u8> {
        let mut body = Vec::new();
        for v in [1, 0, 0, 0] {
            varint(&mut body, v); // type, start, duration, delta
        }
        body.push(1);
        varint(&mut body, pools.len() as u64);
        for (class, entries) in pools {
            varint(&mut body, *class);
            varint(&mut body, entries.len() as u64);
            for (key, fields) in entries {
                varint(&mut body, *key);
                body.extend(fields);
            }
        }
        sized(body)
    }

    fn refs(keys: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        keys.iter().for_each(|k| varint(&mut out, *k));
        out
    }

    #[test]
    fn frames_that_cannot_be_named_are_left_out_and_counted() {
        let md = metadata_event(&[
            (4, "int", &[]),
            (20, "java.lang.String", &[]),
            (30, "jdk.types.Symbol", &[("string", 20, false)]),
            (40, "java.lang.Class", &[("name", 30, true)]),
            (
                50,
                "jdk.types.Method",
                &[("type", 40, true), ("name", 30, true)],
            ),
            (
                60,
                "jdk.types.StackFrame",
                &[("method", 50, true), ("lineNumber", 4, false)],
            ),
            (70, "jdk.types.StackTrace", &[("frames[]", 60, false)]),
        ]);
        let md = Metadata::read(&mut Cursor::new(&md), &mut Meter::unbounded()).unwrap();
        let symbol = |s: &str| {
            let mut out = Vec::new();
            utf8(&mut out, s);
            out
        };
        // Method 1 is A.run; method 2 is not in the pool; method 3's class
        // is not either.
        let trace = {
            let mut t = Vec::new();
            varint(&mut t, 3);
            for (method, line) in [(1, 7), (2, 8), (3, 9)] {
                varint(&mut t, method);
                varint(&mut t, line);
            }
            t
        };
        let mut chunk = vec![0u8; HEADER_LEN];
        let at = chunk.len();
        chunk.extend(checkpoint(&[
            (30, vec![(1, symbol("A")), (2, symbol("run"))]),
            (40, vec![(1, refs(&[1]))]),
            (50, vec![(1, refs(&[1, 2])), (3, refs(&[9, 2]))]),
            (70, vec![(5, trace)]),
        ]));
        let pools = Pools::read(&chunk, at, &md, &mut Meter::unbounded()).unwrap();
        let mut stacks = Stacks::new(&md, &pools);
        let mut meter = Meter::unbounded();
        assert!(stacks.has_frames(5, &mut meter).unwrap());
        let mut frames = Vec::new();
        let left_out = stacks.frames_into(5, &mut frames).unwrap();
        assert_eq!(left_out, 2);
        assert_eq!(frames, vec![Frame { method: 1, line: 7 }]);
        assert_eq!(stacks.name(1), "A.run");
    }

    #[test]
    fn generated_names_are_made_stable_as_pyroscope_does() {
        for (from, to) in [
            (
                "jdk/internal/reflect/GeneratedMethodAccessor31",
                "jdk/internal/reflect/GeneratedMethodAccessor_",
            ),
            (
                "org/example/OrderService$$Lambda$669.0x0000000800fd7318",
                "org/example/OrderService$$Lambda_",
            ),
            ("Fib$$Lambda.0x00007ffa600c4da0", "Fib$$Lambda_"),
            ("Fib$$Lambda/0x00007ffa600c4da0", "Fib$$Lambda_"),
            ("Fib$$Lambda$12", "Fib$$Lambda$12"),
            ("Fib$$Lambda12", "Fib$$Lambda_"),
            (
                "a/Svc$$EnhancerBySpringCGLIB$$1a2b",
                "a/Svc$$EnhancerBySpringCGLIB$$_",
            ),
            (
                "libzstd-jni-1.5.1-16931311898282279136.so",
                "libzstd-jni-_.so",
            ),
            (
                "./tmp/libamazonCorrettoCryptoProvider109b39cf33c563eb.so",
                "libamazonCorrettoCryptoProvider_.so",
            ),
            (
                "/tmp/amazonCorrettoCryptoProviderNativeLibraries.7382c2f79097f415/libcrypto.so (deleted)",
                "libamazonCorrettoCryptoProvider_.so",
            ),
            (
                "libasyncProfiler-linux-x64-17b9a1d8156277a98ccc871afa9a8f69215f92.so",
                "libasyncProfiler-_.so",
            ),
            ("java/lang/Thread", "java/lang/Thread"),
            ("run", "run"),
            ("$$Lambda.0x1", "$$Lambda.0x1"),
        ] {
            assert_eq!(stable_symbol(from.to_owned()), to, "{from}");
        }
    }
}
