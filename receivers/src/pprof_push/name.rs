//! The `name` query value of `/ingest`: `app.name{key=value,...}`, the
//! application name followed by optional tags, as Pyroscope clients write it
//! (pyroscope-go: `myapp{__session_id__=…,otel.scope.name=com.grafana.pyroscope/go}`).
//!
//! The syntax follows Pyroscope's parser: the application name may use letters,
//! digits and `_ . - /`; tag keys letters, digits, `_` and `.`; values are
//! everything up to the next `,` or `}` (no quoting or escaping exists), and
//! keys and values are trimmed. Where Pyroscope silently drops input (an
//! unclosed `{`, a tag without `=`, text after `}`) we refuse it, so a client
//! bug shows up as a 400 instead of missing labels.

use super::labels::MAX_LABELS_PER_SERIES;

/// The application name and tags of a `name` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppName {
    pub app: String,
    /// Tags in the order written; keys are as written (not yet sanitized).
    pub tags: Vec<(String, String)>,
}

/// Why a `name` value could not be read. Messages say what to send instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NameError {
    #[error(
        "the application name is missing: send name=<app>{{key=value,...}}, for example name=checkout{{env=prod}}"
    )]
    MissingApp,
    #[error(
        "invalid application name {app:?}: character {ch:?} is not allowed (use letters, digits and _ . - /)"
    )]
    InvalidAppChar { app: String, ch: char },
    #[error("the tags in name {0:?} are not closed: end them with '}}'")]
    Unclosed(String),
    #[error("unexpected text {0:?} after the closing '}}' of the tags")]
    TrailingText(String),
    #[error("tag {0:?} has no value: write key=value")]
    MissingEquals(String),
    #[error("a tag has an empty key: write key=value")]
    EmptyKey,
    #[error(
        "invalid tag key {key:?}: character {ch:?} is not allowed (use letters, digits, _ and .)"
    )]
    InvalidKeyChar { key: String, ch: char },
    #[error("tag key __name__ is reserved: put the application name before the '{{'")]
    ReservedKey,
    #[error("more than {limit} tags: send at most {limit} key=value tags in name")]
    TooManyTags { limit: usize },
}

fn is_app_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.')
}

/// Parses `app{k=v,...}`; the braces are optional.
pub(crate) fn parse_name(name: &str) -> Result<AppName, NameError> {
    let (app, rest) = match name.split_once('{') {
        Some((app, rest)) => (app.trim(), Some(rest)),
        None => (name.trim(), None),
    };
    if app.is_empty() {
        return Err(NameError::MissingApp);
    }
    if let Some(ch) = app.chars().find(|&c| !is_app_char(c)) {
        return Err(NameError::InvalidAppChar {
            app: app.to_owned(),
            ch,
        });
    }
    let mut tags = Vec::new();
    if let Some(rest) = rest {
        let (body, after) = rest
            .split_once('}')
            .ok_or_else(|| NameError::Unclosed(name.to_owned()))?;
        if !after.trim().is_empty() {
            return Err(NameError::TrailingText(after.to_owned()));
        }
        for item in body.split(',') {
            // Empty items (`a=1,,b=2` or a trailing comma) carry nothing.
            if item.trim().is_empty() {
                continue;
            }
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| NameError::MissingEquals(item.trim().to_owned()))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(NameError::EmptyKey);
            }
            if let Some(ch) = key.chars().find(|&c| !is_key_char(c)) {
                return Err(NameError::InvalidKeyChar {
                    key: key.to_owned(),
                    ch,
                });
            }
            if key == "__name__" {
                return Err(NameError::ReservedKey);
            }
            if tags.len() == MAX_LABELS_PER_SERIES {
                return Err(NameError::TooManyTags {
                    limit: MAX_LABELS_PER_SERIES,
                });
            }
            tags.push((key.to_owned(), value.trim().to_owned()));
        }
    }
    Ok(AppName {
        app: app.to_owned(),
        tags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn app_only_and_with_tags() {
        assert_eq!(
            parse_name("my-app.cpu"),
            Ok(AppName {
                app: "my-app.cpu".into(),
                tags: vec![]
            })
        );
        assert_eq!(
            parse_name(" checkout { env = prod , region=eu-west/1 } "),
            Ok(AppName {
                app: "checkout".into(),
                tags: tags(&[("env", "prod"), ("region", "eu-west/1")])
            })
        );
        assert_eq!(parse_name("a{}").map(|n| n.tags), Ok(vec![]));
        assert_eq!(
            parse_name("a{x=1,}").map(|n| n.tags),
            Ok(tags(&[("x", "1")]))
        );
        // Values may hold anything but ',' and '}', including '=' and '{'.
        assert_eq!(
            parse_name("a{q=x=y{z}").map(|n| n.tags),
            Ok(tags(&[("q", "x=y{z")]))
        );
    }

    #[test]
    fn what_pyroscope_go_sends() {
        let n = parse_name(
            "svc{__session_id__=1a2b,otel.scope.name=com.grafana.pyroscope/go,otel.scope.version=v1.2.0,process.runtime.name=go}",
        )
        .unwrap();
        assert_eq!(n.app, "svc");
        assert_eq!(n.tags[0], ("__session_id__".into(), "1a2b".into()));
        assert_eq!(
            n.tags[1],
            ("otel.scope.name".into(), "com.grafana.pyroscope/go".into())
        );
    }

    #[test]
    fn bad_syntax_is_refused() {
        assert_eq!(parse_name(""), Err(NameError::MissingApp));
        assert_eq!(parse_name("{env=prod}"), Err(NameError::MissingApp));
        assert!(matches!(
            parse_name("my app"),
            Err(NameError::InvalidAppChar { ch: ' ', .. })
        ));
        assert!(matches!(
            parse_name("a{env=prod"),
            Err(NameError::Unclosed(_))
        ));
        assert!(matches!(
            parse_name("a{env=prod}x"),
            Err(NameError::TrailingText(_))
        ));
        assert!(matches!(
            parse_name("a{env}"),
            Err(NameError::MissingEquals(_))
        ));
        assert_eq!(parse_name("a{=1}"), Err(NameError::EmptyKey));
        assert!(matches!(
            parse_name("a{my-key=1}"),
            Err(NameError::InvalidKeyChar { ch: '-', .. })
        ));
        assert_eq!(parse_name("a{__name__=b}"), Err(NameError::ReservedKey));
    }

    #[test]
    fn tags_are_capped() {
        let tags_of = |n: usize| {
            let body: Vec<String> = (0..n).map(|i| format!("k{i}=v")).collect();
            format!("a{{{}}}", body.join(","))
        };
        assert_eq!(
            parse_name(&tags_of(MAX_LABELS_PER_SERIES)).map(|n| n.tags.len()),
            Ok(MAX_LABELS_PER_SERIES)
        );
        let err = parse_name(&tags_of(MAX_LABELS_PER_SERIES + 1)).unwrap_err();
        assert_eq!(
            err,
            NameError::TooManyTags {
                limit: MAX_LABELS_PER_SERIES
            }
        );
        assert!(err.to_string().contains("128"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = parse_name(&s);
        }

        #[test]
        fn well_formed_names_roundtrip(
            app in "[a-z][a-z0-9_./-]{0,12}",
            pairs in proptest::collection::vec(("[a-z_][a-z0-9_.]{0,8}", "[a-z0-9 /:-]{0,8}"), 0..5),
        ) {
            proptest::prop_assume!(pairs.iter().all(|(k, _)| k != "__name__"));
            let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let parsed = parse_name(&format!("{app}{{{}}}", body.join(","))).unwrap();
            proptest::prop_assert_eq!(parsed.app, app);
            let want: Vec<(String, String)> =
                pairs.iter().map(|(k, v)| (k.clone(), v.trim().to_owned())).collect();
            proptest::prop_assert_eq!(parsed.tags, want);
        }
    }
}
