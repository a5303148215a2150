//! One line for an error and its sources.

/// An error and its sources, `a: b: c` (hyper's and tonic's errors say
/// what went wrong only in their sources).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
