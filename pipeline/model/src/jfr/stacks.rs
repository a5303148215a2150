//! Stack traces out of the constant pools, as Pyroscope names their frames:
//! `<class>.<method>` with the class in the JVM's internal form
//! (`java/lang/Thread.run`; for async-profiler's native frames the library
//! stands for the class: `libc.so.6.start_thread`), leaf first, with the
//! frame's line number. A frame whose method or class cannot be found is
//! left out. Every stack is resolved once and kept by its key.

use std::collections::HashMap;

use super::cursor::JfrString;
use super::metadata::Metadata;
use super::pools::Pools;
use super::values::Value;

/// One frame: its function's name and its line (0 when unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub line: u32,
}

/// Resolves stack-trace keys of one chunk.
pub struct Stacks<'a> {
    pools: &'a Pools,
    ids: Ids,
    resolved: HashMap<u64, Vec<Frame>>,
}

/// The class ids and field positions the resolution needs.
#[derive(Debug, Default, Clone)]
struct Ids {
    stack_trace: Option<u64>,
    frames: Option<usize>,
    frame_method: Option<usize>,
    frame_line: Option<usize>,
    method: Option<u64>,
    method_type: Option<usize>,
    method_name: Option<usize>,
    class: Option<u64>,
    class_name: Option<usize>,
    symbol: Option<u64>,
    symbol_string: Option<usize>,
    string: Option<u64>,
}

impl<'a> Stacks<'a> {
    pub fn new(md: &Metadata, pools: &'a Pools) -> Self {
        let class = |name: &str| md.class_named(name);
        let field = |name: &str, f: &str| class(name).and_then(|c| c.field(f));
        let ids = Ids {
            stack_trace: class("jdk.types.StackTrace").map(|c| c.id),
            frames: field("jdk.types.StackTrace", "frames"),
            frame_method: field("jdk.types.StackFrame", "method"),
            frame_line: field("jdk.types.StackFrame", "lineNumber"),
            method: class("jdk.types.Method").map(|c| c.id),
            method_type: field("jdk.types.Method", "type"),
            method_name: field("jdk.types.Method", "name"),
            class: class("java.lang.Class").map(|c| c.id),
            class_name: field("java.lang.Class", "name"),
            symbol: class("jdk.types.Symbol").map(|c| c.id),
            symbol_string: field("jdk.types.Symbol", "string"),
            string: class("java.lang.String").map(|c| c.id),
        };
        Stacks {
            pools,
            ids,
            resolved: HashMap::new(),
        }
    }

    /// The frames of stack trace `key`, leaf first (empty when unknown).
    pub fn frames(&mut self, key: u64) -> &[Frame] {
        if !self.resolved.contains_key(&key) {
            let frames = self.resolve(key).unwrap_or_default();
            self.resolved.insert(key, frames);
        }
        &self.resolved[&key]
    }

    fn resolve(&self, key: u64) -> Option<Vec<Frame>> {
        let ids = &self.ids;
        let trace = self.pools.get(ids.stack_trace?, key)?;
        let Value::Array(frames) = trace.fields().get(ids.frames?)? else {
            return None;
        };
        Some(
            frames
                .iter()
                .filter_map(|f| {
                    let method = f.fields().get(ids.frame_method?)?.int()?;
                    let line = f
                        .fields()
                        .get(ids.frame_line?)
                        .and_then(Value::int)
                        .and_then(|l| u32::try_from(l).ok())
                        // No line is written as -1 in 32 bits.
                        .filter(|&l| l != u32::MAX)
                        .unwrap_or(0);
                    Some(Frame {
                        name: self.method_name(method)?,
                        line,
                    })
                })
                .collect(),
        )
    }

    fn method_name(&self, key: u64) -> Option<String> {
        let ids = &self.ids;
        let method = self.pools.get(ids.method?, key)?;
        let class = method.fields().get(ids.method_type?)?.int()?;
        let name = self.symbol(method.fields().get(ids.method_name?)?.int()?)?;
        let class = self.pools.get(ids.class?, class)?;
        let class_name = self.symbol(class.fields().get(ids.class_name?)?.int()?)?;
        Some(format!("{class_name}.{name}"))
    }

    fn symbol(&self, key: u64) -> Option<String> {
        let ids = &self.ids;
        let symbol = self.pools.get(ids.symbol?, key)?;
        match symbol.fields().get(ids.symbol_string?)? {
            Value::Str(JfrString::Text(s)) => Some(s.clone()),
            Value::Str(JfrString::PoolKey(k)) => match self.pools.get(ids.string?, *k)? {
                Value::Str(JfrString::Text(s)) => Some(s.clone()),
                _ => None,
            },
            _ => None,
        }
    }
}
