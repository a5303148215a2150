//! Pieces of URLs that components build: query-string escaping (the
//! `pyroscope` exporter's `/ingest?name=…`, the `scrape` receiver's
//! `params`).

/// Percent-encodes everything but unreserved characters (RFC 3986:
/// letters, digits, `-`, `_`, `.`, `~`), for a query name or value.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(
            percent_encode("app.cpu{env=prod, x=1}"),
            "app.cpu%7Benv%3Dprod%2C%20x%3D1%7D"
        );
        assert_eq!(percent_encode("a-b_c.d~é"), "a-b_c.d~%C3%A9");
    }
}
